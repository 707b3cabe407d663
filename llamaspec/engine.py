"""The speculative loop: draft -> verify in one target batch -> keep the accepted part of the KV.

One step of sequence `seq` (n_past tokens in the target's KV cache, `last` sampled but not yet
evaluated):

    draft  = drafter.propose(seq, history, k)          # d_1..d_k, maybe empty
    rows   = target.decode([last, d_1..d_k])           # k + 1 logits rows, one batch
    n, t   = verify(draft, rows)                       # n accepted, t = the target's own next token
    KV    := positions < n_past + 1 + n                # rejected draft positions removed
    history += d_1..d_n, t

With no draft this is exactly plain decoding (one token per decode), and it is the baseline the
speculative paths are compared against, token for token. Verification is greedy argmax matching at
temperature 0, rejection sampling when the drafter gives probabilities, and llama-server's
sample-and-match otherwise; all three emit the target's own distribution.

Sequence ids are explicit throughout so several sequences can share one context later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from llamaspec.controller import DraftLengthController
from llamaspec.drafters.base import Draft, Drafter
from llamaspec.runtime import Context, DecodeClock, Model, Utf8Stream
from llamaspec.stats import SpecStats
from llamaspec.verify import (
    SamplingParams,
    sample_token,
    step_sampler,
    target_distribution,
    verify_greedy,
    verify_rejection,
    verify_sample_and_match,
)


@dataclass
class GenerationConfig:
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    stop: Sequence[str] = ()
    draft_max: int = 16        # upper bound on k; the controller picks k <= this each step
    draft_min: int = 0         # drafts shorter than this are dropped (llama.cpp --spec-draft-n-min)
    adaptive: bool = True      # let the controller move k with the measured acceptance


@dataclass
class Generation:
    tokens: list[int]
    text: str
    n_prompt: int
    stop_reason: str            # "eos" | "length" | "stop" | "context" | "interrupted"
    stats: SpecStats


# on_text(text, from_draft, source): streaming callback for new text; from_draft is True for
# text of accepted draft tokens (for --color), source names the drafter.
TextCallback = Callable[[str, bool, str], None]


class StopStrings:
    """Finds stop strings in streamed text, holding back what could be the start of one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.emitted = 0

    def push(self, piece: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit now, stopped)."""
        self.text += piece
        if self.stops:
            start = max(0, self.emitted - self.hold)
            hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                cut = min(hits)
                out = self.text[self.emitted:cut]
                self.text = self.text[:cut]
                self.emitted = cut
                return out, True
        safe = max(self.emitted, len(self.text) - self.hold) if self.stops else len(self.text)
        out = self.text[self.emitted:safe]
        self.emitted = safe
        return out, False

    def flush(self) -> str:
        out = self.text[self.emitted:]
        self.emitted = len(self.text)
        return out


class SpecEngine:
    """Generates with one target context and an optional drafter; models stay loaded across calls."""

    def __init__(self, target: Model, ctx: Context, drafter: Drafter | None = None):
        self.target = target
        self.ctx = ctx
        self.drafter = drafter
        self.last_controller: DraftLengthController | None = None

    def generate(self, prompt_tokens: Sequence[int], config: GenerationConfig,
                 on_text: TextCallback | None = None, seq_id: int = 0,
                 should_stop: Callable[[], bool] | None = None) -> Generation:
        target, ctx, drafter = self.target, self.ctx, self.drafter
        params = config.sampling
        greedy = params.greedy
        rng = params.rng()
        stats = SpecStats(prompt_tokens=len(prompt_tokens))
        if not prompt_tokens:
            prompt_tokens = [target.bos] if target.bos >= 0 else []
        prompt = list(prompt_tokens)
        # One controller per sequence: k follows this sequence's measured acceptance and costs.
        ctl = None
        if drafter is not None and config.adaptive and config.draft_max > 0:
            ctl = DraftLengthController(n_min=max(1, config.draft_min), n_max=config.draft_max)
        self.last_controller = ctl

        # Prompt: evaluate all of it, sample the first token the plain way.
        t0 = time.perf_counter()
        ctx.seq_rm(seq_id, 0, -1)
        n_out = ctx.decode(prompt, 0, seq_id, outputs="last")
        first = self._sample_plain(ctx.logits(n_out)[0], prompt, params, rng)
        if drafter is not None:
            drafter.begin(seq_id, prompt)
        t1 = time.perf_counter()
        stats.prompt_seconds = t1 - t0

        decode_clock0 = DecodeClock.seconds
        history = prompt
        n_past = len(prompt)              # tokens in the target KV; history[-1] is not among them
        generated: list[int] = []
        stream = Utf8Stream()
        stops = StopStrings(config.stop)
        text_parts: list[str] = []
        stop_reason = "length"
        draft_s = verify_s = 0.0

        def emit(tokens: list[int], n_acc: int, source: str) -> bool:
            """Append tokens (the first n_acc from the draft) to the output; True to stop."""
            nonlocal stop_reason
            for j, tok in enumerate(tokens):
                if target.is_eog(tok):
                    stop_reason = "eos"
                    return True
                generated.append(tok)
                piece, hit = stops.push(stream.push(target.piece(tok)))
                if piece:
                    text_parts.append(piece)
                    if on_text is not None:
                        on_text(piece, j < n_acc, source)
                if hit:
                    stop_reason = "stop"
                    return True
                if len(generated) >= config.max_tokens:
                    stop_reason = "length"
                    return True
            return False

        pending = [first]                 # sampled, to be appended to history and emitted
        done = config.max_tokens <= 0 or emit(pending, 0, "")
        history.append(first)
        if drafter is not None:
            drafter.accepted(seq_id, 0, pending, is_other=True)
        try:
            while not done:
                if should_stop is not None and should_stop():
                    stop_reason = "interrupted"
                    break
                room = ctx.n_ctx - n_past - 1
                if room < 0:
                    stop_reason = "context"
                    break
                k = min(config.draft_max, config.max_tokens - len(generated) - 1, room)
                if ctl is not None:
                    k = min(k, ctl.choose())
                ta = time.perf_counter()
                draft = drafter.propose(seq_id, history, k) if (drafter is not None and k > 0) else _NO_DRAFT
                if len(draft) > k:
                    draft = draft.truncated(k)
                if 0 < len(draft) < config.draft_min:
                    draft = _NO_DRAFT
                if draft and max(draft.tokens) >= target.n_vocab:
                    draft = _valid_prefix(draft, target.n_vocab)  # a forced foreign-vocab draft
                tb = time.perf_counter()
                d = draft.tokens
                last = history[-1]
                state = ctx.save_seq(seq_id) if (d and target.needs_checkpoints) else None
                n_out = ctx.decode([last] + d, n_past, seq_id, outputs="all")
                rows = ctx.logits(n_out)
                n_acc, nxt = self._verify(d, draft, rows, history, params, rng, greedy)
                # Drop the rejected draft positions from the KV cache.
                if n_acc < len(d):
                    if state is None:
                        ctx.seq_rm(seq_id, n_past + 1 + n_acc, -1)
                    else:  # recurrent state: restore and replay the accepted part
                        ctx.load_seq(state, seq_id)
                        ctx.decode([last] + d[:n_acc], n_past, seq_id, outputs=0)
                tc = time.perf_counter()
                draft_s += tb - ta
                verify_s += tc - tb
                new = d[:n_acc] + [nxt]
                n_past += 1 + n_acc
                history.extend(new)
                before = len(generated)
                done = emit(new, n_acc, draft.source)
                stats.record_step(len(d), n_acc, len(generated) - before, draft.source)
                if ctl is not None:
                    ctl.observe(len(d), n_acc, verify_seconds=tc - tb, draft_seconds=tb - ta)
                if drafter is not None:
                    drafter.accepted(seq_id, n_acc, new, is_other=not d)
        except KeyboardInterrupt:
            stop_reason = "interrupted"
        finally:
            if drafter is not None:
                drafter.end(seq_id)
        tail = stops.push(stream.flush())[0] + stops.flush() if stop_reason != "stop" else ""
        if tail:
            text_parts.append(tail)
            if on_text is not None:
                on_text(tail, False, "")
        stats.gen_seconds = time.perf_counter() - t1
        stats.draft_seconds = draft_s
        stats.verify_seconds = verify_s
        # Overhead: generation wall time not spent inside llama_decode (target or draft).
        stats.overhead_seconds = max(0.0, stats.gen_seconds - (DecodeClock.seconds - decode_clock0))
        return Generation(generated, "".join(text_parts), len(prompt_tokens), stop_reason, stats)

    # -- sampling / verification ---------------------------------------------------------------
    @staticmethod
    def _sample_plain(row: np.ndarray, history: Sequence[int], params: SamplingParams,
                      rng: np.random.Generator) -> int:
        if params.greedy and not params.penalties_on:
            return int(row.argmax())
        return sample_token(row, params, _recent(history, params), rng)

    @staticmethod
    def _verify(d: list[int], draft: Draft, rows: np.ndarray, history: Sequence[int],
                params: SamplingParams, rng: np.random.Generator, greedy: bool) -> tuple[int, int]:
        if greedy and not params.penalties_on:
            if not d:
                return 0, int(rows[0].argmax())
            return verify_greedy(d, rows)
        if not greedy and draft.probs is not None and d:
            recent = list(_recent(history, params))
            p_rows = [target_distribution(rows[i], params, recent + d[:i]) for i in range(len(d) + 1)]
            return verify_rejection(d, draft.probs, p_rows, rng)
        return verify_sample_and_match(d, rows, step_sampler(params, history, d, rng))


_NO_DRAFT = Draft([])


def _valid_prefix(draft: Draft, n_vocab: int) -> Draft:
    """The draft up to its first token id the target does not have (such a token is rejected anyway)."""
    n = next(i for i, t in enumerate(draft.tokens) if t >= n_vocab)
    return draft.truncated(n)


def _recent(history: Sequence[int], params: SamplingParams) -> Sequence[int]:
    if not params.penalties_on:
        return ()
    n = params.repeat_last_n
    return history[-n:] if n > 0 else history
