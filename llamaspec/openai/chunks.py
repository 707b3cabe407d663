"""A streamed reply as OpenAI's chunks, one place for the server's SSE and the Python API's
`stream=True`: text pieces in, chunks out, with the pieces' logprobs and, when the request
offered tools, the tool streamer's deltas (content and tool_calls pieces as OpenAI sends them).

A chunk carries the logprobs of the tokens whose text ends in its piece (the engine hands each
piece over with them: speculative/output.py); the final chunk carries the rest (the tokens of a
stop string, whose text is never sent).
"""

from __future__ import annotations

from typing import Any, Sequence

from llamaspec.openai import responses as oa_resp
from llamaspec.openai.logprobs import Piece, chat_logprobs, completion_logprobs


class Chunks:
    """Chunks of one streamed reply. chat: chat.completion.chunk objects, else text_completion
    ones; tools: the request's ToolPlan whose calls are parsed out of the text (None: plain
    text); piece: the model's token bytes (for logprobs)."""

    def __init__(self, chat: bool, ids: dict, include_usage: bool, tools: Any = None, piece: Piece | None = None):
        self.chat, self.ids, self.usage = chat, ids, include_usage
        self.tools = tools.streamer() if tools is not None else None
        self.piece = piece
        self.sent = 0         # logprobs sent so far
        self.offset = 0       # characters of text sent so far (completions' text_offset)

    def _logprobs(self, lps: Sequence[Any] | None) -> dict | None:
        if lps is None or self.piece is None:
            return None
        if self.chat:
            return chat_logprobs(lps, self.piece)
        return completion_logprobs(lps, self.piece, self.offset)

    def first(self) -> list[dict]:
        return [oa_resp.chat_chunk(**self.ids, role=True, include_usage=self.usage)] if self.chat else []

    def text(self, piece: str, logprobs: Sequence[Any] | None = None) -> list[dict]:
        """The chunks of a new text piece; logprobs: those of the tokens whose text ends in it."""
        self.sent += len(logprobs or ())
        lp = self._logprobs(logprobs)
        if not self.chat:
            out = [oa_resp.completion_chunk(**self.ids, text=piece, include_usage=self.usage, logprobs=lp)]
            self.offset += len(piece)
            return out
        if self.tools is None:
            return [oa_resp.chat_chunk(**self.ids, content=piece, include_usage=self.usage, logprobs=lp)]
        deltas = self.tools.push(piece)
        if not deltas and logprobs:   # (the text is held back: its logprobs go now anyway)
            deltas = [{}]
        return [oa_resp.chat_chunk(**self.ids, delta=d, include_usage=self.usage, logprobs=lp if i == 0 else None)
                for i, d in enumerate(deltas)]

    def end(self, result: Any, timings: dict | None = None) -> list[dict]:
        """The last chunks: the tool streamer's rest, the finish_reason, and the usage chunk."""
        out: list[dict] = []
        rest = getattr(result, "logprobs", None)
        lp = self._logprobs(None if rest is None else rest[self.sent:])
        if self.tools is not None:
            out += [oa_resp.chat_chunk(**self.ids, delta=d, include_usage=self.usage) for d in self.tools.finish()]
        build = oa_resp.chat_chunk if self.chat else oa_resp.completion_chunk
        out.append(build(**self.ids, finish_reason=result.finish_reason, include_usage=self.usage, timings=timings,
                         logprobs=lp))
        if self.usage:
            out.append(build(**self.ids, usage=oa_resp.result_usage(result)))
        return out
