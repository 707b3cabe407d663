"""`Generator.generate(..., stream=True)`: the text as an iterator of pieces, driven in the caller's
thread one engine step at a time (no background thread: llama.cpp contexts are not thread-safe,
and Ctrl-C must reach the loop that is generating).

    stream = gen.generate("Write a haiku.", stream=True)
    for piece in stream:
        print(piece, end="", flush=True)
    print(stream.result.stats["acceptance"])

Breaking out of the loop ends the generation (finish_reason "interrupted" on `result`) and keeps
the sequence's KV cache consistent for the next call. The stream owns the Generator's contexts from
its first piece to its end (llamaspec/api/ownership.py): a stream iterated after `Generator.close()`
raises UsageError, and a second stream in the same thread is refused while this one is open.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from llamaspec.errors import GenerationInterrupted

if TYPE_CHECKING:
    from llamaspec.api.ownership import ContextOwner


class TextStream:
    """An iterable of text pieces; `result` is the whole `Result` once the iteration has ended."""

    def __init__(self, engine, tokens: Sequence[int], config, make_result: Callable[[object], object],
                 on_text=None, *, owner: "ContextOwner", tools=None):
        self._engine, self._tokens, self._config, self._owner = engine, tokens, config, owner
        self._make_result, self._on_text = make_result, on_text
        self._started = False
        self._seq = None
        self.tools = tools   # the ToolPlan the reply's calls are parsed with (None: plain text)
        self.result = None   # the generator's Result once the iteration has ended

    @property
    def logprobs(self) -> list | None:
        """The logprobs (TokenLogprob) of the tokens generated so far, when the request asked."""
        rules = self._seq.rules if self._seq is not None else None
        return None if rules is None else rules.logprobs

    def __iter__(self) -> Iterator[str]:
        return self._start(False)

    def with_logprobs(self) -> Iterator[tuple[str, list | None]]:
        """Iterate as (piece, logprobs of the tokens whose text ends in it, or None) instead:
        the OpenAI chunks' pairs (a token's logprob never rides with another piece's text)."""
        return self._start(True)

    def _start(self, pairs: bool):
        if self._started:
            raise RuntimeError("a TextStream can be iterated once")
        self._started = True
        return self._run(pairs)

    def _run(self, pairs: bool):
        from llamaspec.speculative.sequence import SequenceRun

        pieces: deque = deque()

        def collect(piece: str, from_draft: bool, source: str, logprobs) -> None:
            pieces.append((piece, logprobs) if pairs else piece)
            if self._on_text is not None:
                self._on_text(piece, from_draft, source)

        self._owner.acquire()
        try:
            self._seq = SequenceRun(self._engine, 0, self._tokens, self._config, None, collect)
            yield from self._steps(self._seq, pieces)
        finally:
            self._owner.release()

    def _steps(self, seq, pieces: deque):
        try:
            seq.start()
            while True:
                while pieces:
                    yield pieces.popleft()
                self._owner.check()   # close() was called while the stream was open
                if seq.done:
                    break
                self._engine.step([seq])
        except KeyboardInterrupt as e:
            seq.stop("interrupted")
            self.result = self._make_result(seq.finish())
            raise GenerationInterrupted(self.result) from e
        except GeneratorExit:   # the caller stopped iterating: end the sequence cleanly
            seq.stop("interrupted")
            self.result = self._make_result(seq.finish())
            raise
        except BaseException:
            seq.abandon()
            raise
        self.result = self._make_result(seq.finish())
        yield from pieces   # text held back for stop strings, flushed by finish()
