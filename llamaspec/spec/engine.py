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
from typing import Callable, Literal, Sequence

import numpy as np

from llamaspec.spec.controller import CostModel, DraftLengthController
from llamaspec.spec.drafters.base import Draft, Drafter
from llamaspec.runtime.llama import DecodeClock, Model, Utf8Stream
from llamaspec.runtime.context import Context
from llamaspec.spec.metrics import SpecStats
from llamaspec.spec.verify import (
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


#: why a generation ended: an end-of-generation token, -n reached, a stop string, the context
#: full, or interrupted (Ctrl-C / should_stop)
StopReason = Literal["eos", "length", "stop", "context", "interrupted"]


@dataclass
class Generation:
    tokens: list[int]
    text: str
    n_prompt: int
    stop_reason: StopReason
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
        self.eog = _EogSet(target)
        # The adaptive controllers of the last generation, one per drafter (by name).
        self.last_controllers: dict[str, DraftLengthController] = {}

    def generate(self, prompt_tokens: Sequence[int], config: GenerationConfig,
                 on_text: TextCallback | None = None, seq_id: int = 0,
                 should_stop: Callable[[], bool] | None = None) -> Generation:
        target, ctx, drafter = self.target, self.ctx, self.drafter
        params = config.sampling
        verify_rng, draft_rng = random_streams(params.seed)
        stats = SpecStats(prompt_tokens=len(prompt_tokens))
        if not prompt_tokens:
            prompt_tokens = [target.bos] if target.bos >= 0 else []
        prompt = list(prompt_tokens)
        ctls = self._controllers(config, reproducible=params.seed is not None and not params.greedy)
        self.last_controllers = ctls

        # Prompt: evaluate all of it, sample the first token the plain way.
        t0 = time.perf_counter()
        ctx.seq_rm(seq_id, 0, -1)
        n_out = ctx.decode(prompt, 0, seq_id, outputs="last")
        first = self._sample_plain(ctx.logits(n_out)[0], prompt, params, verify_rng)
        if drafter is not None:
            drafter.begin(seq_id, prompt, draft_rng)
        t1 = time.perf_counter()
        stats.prompt_seconds = t1 - t0

        decode_clock0 = DecodeClock.seconds
        history = prompt
        n_past = len(prompt)              # tokens in the target KV; history[-1] is not among them
        out = _Output(target, config, on_text)
        draft_s = verify_s = 0.0
        done = config.max_tokens <= 0 or out.emit([first], 0, "")
        history.append(first)
        if drafter is not None:
            drafter.accepted(seq_id, 0, [first], is_other=True)
        try:
            while not done:
                if should_stop is not None and should_stop():
                    out.stop_reason = "interrupted"
                    break
                room = ctx.n_ctx - n_past - 1
                if room < 0:
                    out.stop_reason = "context"
                    break
                # A verify batch is [last] + draft and must fit one n_batch chunk: only the last
                # chunk of a split batch has output rows.
                k = min(config.draft_max, config.max_tokens - len(out.tokens) - 1, room, ctx.n_batch - 1)
                ta = time.perf_counter()
                draft = self._propose(seq_id, history, k, ctls, config.draft_min, stats)
                tb = time.perf_counter()
                n_acc, nxt = self._verify_step(seq_id, history, n_past, draft, params, verify_rng)
                tc = time.perf_counter()
                draft_s += tb - ta
                verify_s += tc - tb
                d = draft.tokens
                new = d[:n_acc] + [nxt]
                n_past += 1 + n_acc
                history.extend(new)
                before = len(out.tokens)
                done = out.emit(new, n_acc, draft.source)
                stats.record_step(len(d), n_acc, len(out.tokens) - before, draft.source)
                _observe(ctls, draft, n_acc, verify_seconds=tc - tb, draft_seconds=tb - ta)
                if drafter is not None:
                    drafter.accepted(seq_id, n_acc, new, is_other=not d)
        except KeyboardInterrupt:
            out.stop_reason = "interrupted"
        finally:
            if drafter is not None:
                drafter.end(seq_id)
        out.finish()
        stats.gen_seconds = time.perf_counter() - t1
        stats.draft_seconds = draft_s
        stats.verify_seconds = verify_s
        # Overhead: generation wall time not spent inside llama_decode (target or draft).
        stats.overhead_seconds = max(0.0, stats.gen_seconds - (DecodeClock.seconds - decode_clock0))
        return Generation(out.tokens, "".join(out.parts), len(prompt_tokens), out.stop_reason, stats)

    # -- one step ------------------------------------------------------------------------------
    def _controllers(self, config: GenerationConfig, reproducible: bool) -> dict[str, DraftLengthController]:
        """One adaptive controller per drafter (chain members each get their own), for this
        sequence: a paused draft model must not stop a free n-gram drafter from being tried.

        reproducible (a seed at T > 0): a sampled draft is verified by rejection sampling, whose
        random draws depend on which positions were drafted, so the draft lengths must not follow
        measured time, or one seed would give different outputs from run to run. Then every
        drafter decides from acceptance and fixed costs (a verify batch at the default slope,
        drafting at the drafter's size-based `cost_hint`)."""
        if self.drafter is None or not config.adaptive or config.draft_max <= 0:
            return {}
        members = self.drafter.members()
        # In a chain, who drafts a position decides how it is verified: all members, then.
        fixed = reproducible and any(d.samples for d in members)
        ctls = {}
        for d in members:
            cost = None
            if fixed:
                slope = CostModel().default_slope
                cost = CostModel(verify_ratio_fn=lambda k, s=slope: (1.0 + s * (k + 1)) / (1.0 + s),
                                 draft_ratio_value=d.cost_hint)
            ctls[d.name] = DraftLengthController(n_min=max(1, config.draft_min), n_max=config.draft_max,
                                                 cost=cost)
        return ctls

    def _propose(self, seq_id: int, history: list[int], k: int,
                 ctls: dict[str, DraftLengthController], draft_min: int, stats: SpecStats) -> Draft:
        """The drafter's proposal for this step, cut to k tokens (an empty Draft: a plain step).
        Each drafter asked (a chain asks its members in turn) is timed into `stats`."""
        if self.drafter is None or k <= 0:
            return _NO_DRAFT
        asked: list[tuple[str, float]] = []  # (member, when asked): a member's time runs to the next

        def limit(d: Drafter) -> int:
            n = min(k, ctls[d.name].choose()) if ctls else k
            if n > 0:
                asked.append((d.name, time.perf_counter()))
            return n

        draft = self.drafter.propose_within(seq_id, history, limit)
        t_end = time.perf_counter()
        for i, (name, t) in enumerate(asked):
            stats.record_call(name, (asked[i + 1][1] if i + 1 < len(asked) else t_end) - t)
        if len(draft) > k:
            draft = draft.truncated(k)
        # llama.cpp drops drafts shorter than --draft-min. Not a sampled draft verified by rejection
        # sampling: its length depends on its tokens, so dropping the short ones would keep drafts
        # by their tokens and bias the output. Such a draft is verified whatever its length.
        if 0 < len(draft) < draft_min and draft.probs is None:
            return _NO_DRAFT
        if draft and max(draft.tokens) >= self.target.n_vocab:
            draft = _valid_prefix(draft, self.target.n_vocab)  # a forced foreign-vocab draft
        return draft

    def _verify_step(self, seq_id: int, history: list[int], n_past: int, draft: Draft,
                     params: SamplingParams, rng: np.random.Generator) -> tuple[int, int]:
        """Evaluate [last] + draft in one target batch, verify, drop the rejected positions from the
        target's memory. Returns (n accepted, the target's next token)."""
        ctx, d, last = self.ctx, draft.tokens, history[-1]
        state = ctx.save_seq(seq_id) if (d and self.target.needs_checkpoints) else None
        n_out = ctx.decode([last] + d, n_past, seq_id, outputs="all")
        n_acc, nxt = self._verify(d, draft, ctx.logits(n_out), history, params, rng)
        if n_acc < len(d):
            if state is None:
                ctx.seq_rm(seq_id, n_past + 1 + n_acc, -1)
            else:  # recurrent state cannot be cut: restore the checkpoint, replay the accepted part
                ctx.load_seq(state, seq_id)
                ctx.decode([last] + d[:n_acc], n_past, seq_id, outputs=0)
        return n_acc, nxt

    # -- sampling / verification ---------------------------------------------------------------
    @staticmethod
    def _sample_plain(row: np.ndarray, history: Sequence[int], params: SamplingParams,
                      rng: np.random.Generator) -> int:
        if params.greedy and not params.penalties_on:
            return int(row.argmax())
        return sample_token(row, params, _recent(history, params), rng)

    def _verify(self, d: list[int], draft: Draft, rows: np.ndarray, history: Sequence[int],
                params: SamplingParams, rng: np.random.Generator) -> tuple[int, int]:
        eog = self.eog
        if params.greedy and not params.penalties_on:
            if not d:
                return 0, int(rows[0].argmax())
            return verify_greedy(d, rows, eog)
        if not params.greedy and draft.probs is not None and d:
            recent = list(_recent(history, params))
            p_rows = [target_distribution(rows[i], params, recent + d[:i]) for i in range(len(d) + 1)]
            return verify_rejection(d, draft.probs, p_rows, rng, eog)
        return verify_sample_and_match(d, rows, step_sampler(params, history, d, rng), eog)


class _Output:
    """The generated tokens and text of one sequence: streaming, stop strings, stop reason."""

    def __init__(self, target: Model, config: GenerationConfig, on_text: TextCallback | None):
        self.target = target
        self.max_tokens = config.max_tokens
        self.on_text = on_text
        self.tokens: list[int] = []
        self.parts: list[str] = []
        self.stop_reason: StopReason = "length"
        self._stream = Utf8Stream()
        self._stops = StopStrings(config.stop)

    def emit(self, tokens: list[int], n_acc: int, source: str) -> bool:
        """Append tokens (the first n_acc from the draft) to the output; True to stop."""
        for j, tok in enumerate(tokens):
            if self.target.is_eog(tok):
                self.stop_reason = "eos"
                return True
            self.tokens.append(tok)
            piece, hit = self._stops.push(self._stream.push(self.target.piece(tok)))
            if piece:
                self.parts.append(piece)
                if self.on_text is not None:
                    self.on_text(piece, j < n_acc, source)
            if hit:
                self.stop_reason = "stop"
                return True
            if len(self.tokens) >= self.max_tokens:
                self.stop_reason = "length"
                return True
        return False

    def finish(self) -> None:
        """Flush text held back (incomplete UTF-8, a possible stop-string start)."""
        if self.stop_reason == "stop":
            return
        tail = self._stops.push(self._stream.flush())[0] + self._stops.flush()
        if tail:
            self.parts.append(tail)
            if self.on_text is not None:
                self.on_text(tail, False, "")


class _EogSet:
    """The target's end-of-generation ids as a collection for the verifiers (`tok in eog`): an
    accepted EOG draft token ends the step, so tokens after it are never counted as accepted."""

    def __init__(self, target: Model):
        self.target = target

    def __contains__(self, tok: object) -> bool:
        return isinstance(tok, (int, np.integer)) and self.target.is_eog(int(tok))


def random_streams(seed: int | None) -> tuple[np.random.Generator, np.random.Generator]:
    """(verifier, drafter) random streams for one generation, independent of each other.

    Both come from one seed (fresh entropy when None) through numpy's SeedSequence.spawn: two
    generators seeded alike would draw the same numbers, and the number that picks draft token
    i + 1 would be the one that tests token i. New streams per generation also make one seed give
    one output on a pipeline that serves many prompts.

        >>> a, b = random_streams(7)
        >>> a.random() != b.random()
        True
        >>> random_streams(7)[0].random() == random_streams(7)[0].random()
        True
    """
    verify_ss, draft_ss = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(verify_ss), np.random.default_rng(draft_ss)


def _observe(ctls: dict[str, DraftLengthController], draft: Draft, n_acc: int, *,
             verify_seconds: float, draft_seconds: float) -> None:
    """Feed a step to the controllers: the author of the draft learns its acceptance, the others
    only the target's step cost; after a plain step every controller sees it as one."""
    if not ctls:
        return
    n = len(draft)
    author = ctls.get(draft.source) if n else None
    if n and author is None and len(ctls) == 1:
        author = next(iter(ctls.values()))
    for ctl in ctls.values():
        if not n:
            ctl.observe(0, 0, verify_seconds=verify_seconds, draft_seconds=draft_seconds)
        elif ctl is author:
            ctl.observe(n, n_acc, verify_seconds=verify_seconds, draft_seconds=draft_seconds)
        else:
            ctl.observe_cost(n + 1, verify_seconds)


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
