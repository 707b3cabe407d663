"""The engine thread: the only thread that touches the Generator (llama.cpp contexts are not
thread-safe). HTTP handlers hand it `Job`s through a queue and get events back through each job's
`emit` (which posts into the handler's asyncio queue):

    ("accepted", n_prompt)           the request is valid and waits for a slot
    ("text", piece, logprobs)        streamed text, and the logprobs of its tokens (or None)
    ("done", Result, cache_n)        finished; cache_n prompt tokens came from the slot's KV cache
    ("error", status, message, param, code)

Faults stay with their request: whatever raises while one request is prepared, admitted, has its
text sent or is finished ends that request alone (a 500); a failure of the shared step ends the
sequences of that step; the in-flight count stays exact. If the engine thread dies anyway, every
waiting request gets a 500, `dead` says why and `on_death` is called (the server exits non-zero).

Chat templates are rendered and prompts tokenized in preparing threads (never the event loop,
never the engine thread), and a long prompt enters the shared steps in chunks beside the
sequences generating (serve/prefill.py sizes them), so running streams keep flowing.

Up to `parallel` slots (llama.cpp sequence ids) are decoded together, the verify rows of all of
them in one llama_decode per step, each with its own drafter state: the engine's own pieces, as
`SpecEngine.generate_many` drives them (`SequenceRun` start / `engine.step` / finish). Unlike
generate_many, a sequence can be started, stopped or dropped between any two steps, and a request
goes to the free slot whose KV cache shares the longest token prefix with its prompt, so a
returning conversation reuses what the slot already evaluated (`engine.cached`).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

from llamaspec.errors import LlamaspecError, UsageError
from llamaspec.serve.job import Job, fault_point, prepare
from llamaspec.serve.prefill import PrefillBudget
from llamaspec.serve.profile import from_env as profile_from_env
from llamaspec.serve.slots import pick_slot
from llamaspec.speculative.prompt_cache import PromptCache, swap_in

if TYPE_CHECKING:
    from llamaspec.api.generator import Generator
    from llamaspec.speculative.sequence import SequenceRun

MAX_PENDING = 1024   # requests waiting for a slot; beyond it: 503 (the client may retry)
PREPARING_THREADS = 2   # render + tokenize: milliseconds each, the GIL held for most of it
_WAKE = object()
_STOP = object()


class Scheduler:
    """Owns `generator` from `start()` until `stop()` returns; see the module docstring."""

    def __init__(self, generator: "Generator", parallel: int, cache_ram_mib: int = 0, *,
                 timeout: float = float("inf"), on_death: Callable[[], None] | None = None,
                 shared_drafts: bool = True, chunked_prefill: bool = True, max_pending: int = MAX_PENDING):
        from llamaspec.serve.metrics import Metrics

        self.gen, self.parallel = generator, parallel
        # recurrent/hybrid memories cannot be cut to a prefix: nothing to restore a prefix from
        keeps = cache_ram_mib != 0 and not generator.pipeline.target.needs_checkpoints
        self.prompt_cache = PromptCache(cache_ram_mib << 20 if cache_ram_mib > 0 else 1 << 62) if keeps else None
        self.metrics = Metrics(lambda: {"requests_processing": self.processing, "requests_deferred": self.deferred,
                                        "requests_in_flight": self.in_flight})
        self.engine = generator.pipeline.engine
        if not shared_drafts:   # (--suffix-scope request) no drafter learns from other requests' text
            from llamaspec.speculative.drafters.suffix import SuffixDrafter

            for d in self.engine.drafter.members() if self.engine.drafter is not None else ():
                if isinstance(d, SuffixDrafter):
                    d.shared = False
        self._inbox: queue.Queue = queue.Queue()
        self._pending: deque[Job] = deque()
        self._active: dict[int, tuple[Job, "SequenceRun"]] = {}
        self._last_used = {slot: 0 for slot in range(parallel)}
        self._uses = 0
        self._inflight = 0
        self._idle = threading.Condition()
        self.draining = False
        self.timeout, self.on_death, self.max_pending = timeout, on_death, max_pending
        self.dead: str | None = None   # why the engine thread stopped unexpectedly
        self._thread = threading.Thread(target=self._run, name="llamaspec-engine", daemon=True)
        self._preparing = ThreadPoolExecutor(PREPARING_THREADS, thread_name_prefix="llamaspec-prepare")
        self._stopping = False
        # Chunked prefill needs a KV that can hold part of a prompt and rows read per batch:
        # not a recurrent/hybrid target (rolled back by whole-state checkpoints) nor a drafter fed
        # by the target's hidden states on every decode (it reads them as one sequence's rows).
        ctx = self.engine.ctx
        chunkable = not generator.pipeline.target.needs_checkpoints and not ctx.has_decode_listeners
        self.prefill = PrefillBudget(ctx.n_batch) if chunked_prefill and chunkable else None
        self.profile = profile_from_env(ctx)   # LLAMASPEC_SERVE_PROFILE=FILE: where the time goes

    # -- called from the HTTP side (any thread) -------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> bool:
        """Queue a job; False when the server is draining or the queue is full (answer 503)."""
        with self._idle:   # (put under the lock: a dying engine thread drains the inbox under it too)
            if self.draining or self.dead or self._inflight >= self.max_pending + self.parallel:
                return False
            self._inflight += 1
            job.deadline = time.monotonic() + self.timeout
            job.marks["submit"] = time.perf_counter()
            try:
                self._preparing.submit(self._prepare, job)
            except RuntimeError:   # stopped: no more preparing
                self._inflight -= 1
                return False
        return True

    def cancel(self, job: Job) -> None:
        """The client went away: stop its sequence at the next step and free the slot."""
        job.cancelled = True
        self._inbox.put(_WAKE)

    def drain(self) -> None:
        """Refuse new requests from now on (in-flight ones go on)."""
        with self._idle:
            self.draining = True

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)

    def stop(self) -> None:
        """End the engine thread: sequences still running end now (their clients get what was
        generated), queued requests get 503. The Generator is the caller's again afterwards."""
        with self._idle:   # from now on what a preparing thread finishes gets 503 (see _prepare)
            self._stopping = True
        self._inbox.put(_STOP)
        self._thread.join()
        # (no preparing thread may touch the model once the caller has it back: a render ends
        # within the template's time limit, a tokenization in milliseconds)
        self._preparing.shutdown(wait=True)

    @property
    def processing(self) -> int:
        return len(self._active)

    @property
    def deferred(self) -> int:
        return len(self._pending)

    @property
    def in_flight(self) -> int:
        """Requests submitted and not answered yet (queued, waiting for a slot or generating)."""
        return self._inflight

    @property
    def alive(self) -> bool:
        return self.dead is None

    # -- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with self.profile.span("loop"):
                self._loop()
        except BaseException as e:  # noqa: BLE001 - the engine is gone: answer everyone, then say so
            self._die(e)
        finally:
            self.profile.write()

    def _loop(self) -> None:
        while True:
            try:
                with self.profile.span("wait for work"):
                    if self._read_inbox(block=not self._active and not self._pending):
                        break
                self._expire()
                with self.profile.span("admit"):
                    self._admit()
                with self.profile.span("finish"):
                    self._reap()
                if self._active:
                    with self.profile.span("step"):
                        self._step()
                    with self.profile.span("finish"):
                        self._reap()
            except Exception:  # noqa: BLE001 - a bug in one request must not stop the engine thread
                traceback.print_exc(file=sys.stderr)
                for slot, (job, seq) in list(self._active.items()):
                    if seq.done:
                        continue
                    del self._active[slot]
                    self._drop(slot, seq)
                    self._fail(job, 500, "internal error (see the server's log)")
        for job, seq in list(self._active.values()):
            seq.stop("interrupted")
        self._reap()
        while self._pending:
            self._fail(self._pending.popleft(), 503, "the server is shutting down")

    def _die(self, exc: BaseException) -> None:
        """The engine thread is ending on an error no handler took: fail every request it holds
        or would have taken (the Generator is left as it is: nothing may use it any more)."""
        traceback.print_exception(exc, file=sys.stderr)
        message = "internal error: the server's engine stopped (see the server's log); the server is exiting"
        with self._idle:
            self.dead = f"{type(exc).__name__}: {exc}"
            waiting = []
            while True:
                try:
                    waiting.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
        jobs = [job for job, _ in self._active.values()] + list(self._pending)
        jobs += [m for m in waiting if isinstance(m, Job)]
        self._active.clear()
        self._pending.clear()
        for job in jobs:
            self._fail(job, 500, message)
        if self.on_death is not None:
            self.on_death()

    def _expire(self) -> None:
        """--timeout: a request still queued past its deadline gets 503; a generating one ends
        with what it has (finish_reason "length")."""
        now = time.monotonic()
        while self._pending and self._pending[0].deadline <= now:   # (deadlines grow along the queue)
            self._fail(self._pending.popleft(), 503, f"the request waited more than {self.timeout:g} s for a slot "
                                                     "(--timeout); retry later", code="timeout")
        for job, seq in self._active.values():
            if job.deadline <= now and not seq.done:
                seq.stop("length")

    def _read_inbox(self, block: bool) -> bool:
        """Take what the handlers sent; True when told to stop."""
        while True:
            try:
                msg = self._inbox.get(timeout=1.0) if block else self._inbox.get_nowait()
            except queue.Empty:
                return False
            block = False
            if msg is _STOP:
                return True
            if isinstance(msg, Job):   # prepared and accepted: it waits for a slot
                self._pending.append(msg)

    def _prepare(self, job: Job) -> None:
        """In a preparing thread: render the chat template, tokenize and validate (llama.cpp's
        tokenizer only reads the vocabulary: safe beside the engine's decodes, as llama-server
        tokenizes in its HTTP threads). A bad request is answered at once, a good one goes to the
        engine thread to wait for a slot."""
        if job.cancelled:
            return self._finished(job)
        try:
            fault_point(job, "prepare")
            job.tokens, job.config, job.tools = prepare(self.gen, job.request)
        except UsageError as e:
            return self._fail(job, 400, e.message, e.field)   # (the field it names: OpenAI's param)
        except LlamaspecError as e:   # a chat template that refuses these messages
            return self._fail(job, 400, e.message, job.field_prompt)
        except Exception as e:  # noqa: BLE001
            return self._crash(job, e)
        n_ctx = self.gen.n_ctx
        if len(job.tokens) >= n_ctx:   # llama-server's rule: a prompt must leave room for one token
            return self._fail(job, 400, f"the request ({len(job.tokens)} tokens) exceeds the available context size "
                                        f"({n_ctx} tokens per slot), try increasing it", job.field_prompt,
                              "context_length_exceeded")
        job.send(("accepted", len(job.tokens)))
        job.marks["ready"] = time.perf_counter()
        with self._idle:   # (a dying engine thread empties the inbox under this lock, stop() sets _stopping)
            if self.dead is None and not self._stopping:
                self._inbox.put(job)
                return
        if self._stopping:
            return self._fail(job, 503, "the server is shutting down")
        self._fail(job, 500, "internal error: the server's engine stopped (see the server's log)")

    def _admit(self) -> None:
        from llamaspec.speculative.sequence import SequenceRun

        while self._pending and len(self._active) < self.parallel:
            job = self._pending.popleft()
            if job.cancelled:
                self._finished(job)
                continue
            slot, seq = None, None
            try:
                fault_point(job, "admit")
                slot, shared = pick_slot(self.engine.cached, self.parallel, self._active, self._last_used,
                                         job.tokens)
                swap_in(self.prompt_cache, self.engine, slot, job.tokens, shared)
                on_piece = self._text_sink(job) if job.stream else None
                seq = job.seq = SequenceRun(self.engine, slot, job.tokens, job.config, None, on_piece)
                seq.start() if self.prefill is None else seq.begin()   # begin: its prompt comes in chunks
            except LlamaspecError as e:   # cannot run (the context): this request fails, the rest go on
                self._drop(slot, seq)
                self._fail(job, 400, e.message, job.field_prompt, "context_length_exceeded")
                continue
            except Exception as e:  # noqa: BLE001 - a bug must not take the server down
                self._drop(slot, seq)
                self._crash(job, e)
                continue
            self._active[slot] = (job, seq)
            job.marks["admit"] = time.perf_counter()
            self.profile.admit(job.marks, 0 if self.prefill is not None else len(job.tokens) - shared)

    def _text_sink(self, job: Job):
        """The streamed-text callback of `job`'s sequence (called inside the shared step): a
        failure here is the job's, kept for the next reap, never the step's."""
        def on_piece(piece: str, from_draft: bool, source: str, logprobs) -> None:
            if job.error is not None:
                return
            try:
                fault_point(job, "text")
                job.emit(("text", piece, logprobs))   # (logprobs: a list of its own, never changed)
            except Exception as e:  # noqa: BLE001
                job.error = e
        return on_piece

    def _drop(self, slot: int | None, seq: "SequenceRun | None") -> None:
        """Free a slot whose sequence failed: its KV and drafter state go (best effort: a failure
        here is logged, the slot is cleared as far as it can be)."""
        if slot is None:
            return
        try:
            if seq is not None:
                seq.abandon()
            else:
                self.engine.cached.pop(slot, None)
                self.engine.ctx.seq_rm(slot, 0, -1)
        except Exception:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
            self.engine.cached.pop(slot, None)

    def _step(self) -> None:
        seqs = [seq for _, seq in self._active.values()]
        try:
            for job, _ in self._active.values():
                fault_point(job, "step")
                fault_point(job, "engine")
            self._shared_step(seqs)
        except Exception as e:  # noqa: BLE001 - fail the requests of this step, keep serving the next ones
            if not isinstance(e, LlamaspecError):
                traceback.print_exception(e, file=sys.stderr)
            for slot, (job, seq) in list(self._active.items()):
                del self._active[slot]
                self._drop(slot, seq)
                what = e.message if isinstance(e, LlamaspecError) else type(e).__name__
                self._fail(job, 500, f"internal error: {what} (the step shared with other requests failed; "
                                     "see the server's log)")

    def _shared_step(self, seqs: list["SequenceRun"]) -> None:
        """One step of the sequences generating, with the next chunk of the prompts still being
        evaluated (oldest first) as far as `self.prefill` allows."""
        generating = [s for s in seqs if not s.prefilling]
        plan = []
        if self.prefill is not None:
            reserved = sum(1 + s.config.draft_max for s in generating)
            streaming = any(job.stream and not s.prefilling for job, s in self._active.values())
            room = self.prefill.tokens(len(generating), reserved, streaming)
            for s in seqs:
                if s.prefilling and room > 0:
                    n = min(room, s.prompt_left)
                    plan.append((s, n))
                    room -= n
        t0 = time.perf_counter()
        self.engine.step(generating, plan)
        if self.prefill is not None:
            self.prefill.observe(time.perf_counter() - t0, sum(n for _, n in plan), len(generating))

    def _reap(self) -> None:
        """Finish the sequences that are done, or whose client has gone (the slot is free again;
        its KV cache stays for the next prompt's prefix)."""
        for slot, (job, seq) in list(self._active.items()):
            if job.cancelled and not seq.done:
                seq.stop("interrupted")
                self.metrics.cancelled()
            if job.error is not None and not seq.done:
                seq.stop("interrupted")
            if not seq.done:
                continue
            del self._active[slot]
            self._uses += 1
            self._last_used[slot] = self._uses
            try:
                fault_point(job, "finish")
                result = self.gen.result(job.id, seq.finish(), job.tools)
                cache_n = result.stats.get("n_prompt_cached", 0)
                self.metrics.finished(result, cache_n)
            except Exception as e:  # noqa: BLE001 - this request's end failed: it alone gets the error
                self._drop(slot, seq)
                self._crash(job, e)
                continue
            job.marks["done"] = time.perf_counter()
            if job.error is not None:
                self._crash(job, job.error)
            else:
                self._finished(job)
                if not job.cancelled:
                    job.send(("done", result, cache_n))

    def _fail(self, job: Job, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        self._finished(job)   # (first: once a client has its answer, the in-flight count no longer holds it)
        job.send(("error", status, message, param, code))

    def _crash(self, job: Job, exc: BaseException) -> None:
        traceback.print_exception(exc, file=sys.stderr)
        self._fail(job, 500, f"internal error: {type(exc).__name__}: {exc}")

    def _finished(self, job: Job) -> None:
        with self._idle:
            if job.ended:   # answered once, counted once
                return
            job.ended = True
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.notify_all()
