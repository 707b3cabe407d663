"""One sequence being generated, step by step: the part of the speculative loop that is per
sequence (history, KV position, random streams, controllers, statistics, streamed output). The
engine (engine.py) owns the target context and batches the steps of several sequences together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from llamaspec.errors import ContextFullError
from llamaspec.runtime.grammar import GrammarSpec
from llamaspec.runtime.llama import DecodeClock
from llamaspec.speculative.constrained import Constraints
from llamaspec.speculative.controller import DraftLengthController
from llamaspec.speculative.match_controller import count_steps
from llamaspec.speculative.drafters.base import Draft
from llamaspec.speculative.logprobs import TokenLogprob
from llamaspec.speculative.metrics import SpecStats
from llamaspec.speculative.output import EogSet  # noqa: F401  (the engine's)
from llamaspec.speculative.output import Output as _Output
from llamaspec.speculative.output import PieceCallback, StopReason, StopStrings, TextCallback  # noqa: F401
from llamaspec.speculative.sampling_params import SamplingParams, seed_entropy
from llamaspec.speculative.prefix import common_prefix


@dataclass
class GenerationConfig:
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    stop: Sequence[str] = ()
    draft_max: int = 16        # upper bound on k; the controller picks k <= this each step
    draft_min: int = 0         # drafts shorter than this are dropped (llama.cpp --spec-draft-n-min)
    adaptive: bool = True      # let the controller move k with the measured acceptance
    ignore_eos: bool = False   # end-of-generation tokens are never sampled (llama-server's ignore_eos)
    grammar: GrammarSpec | None = None   # the output follows it (constrained.py: llama.cpp's rule)
    logit_bias: Mapping[int, float] | None = None   # token id -> added to the target's raw logits
    logprobs: int | None = None   # None: off; N >= 0: each token's logprob and the top N of its row


@dataclass
class Generation:
    tokens: list[int]
    text: str
    n_prompt: int
    stop_reason: StopReason
    stats: SpecStats
    logprobs: list[TokenLogprob] | None = None   # one per token, when GenerationConfig.logprobs was set


class SequenceRun:
    """One sequence being generated: its history, KV position, random streams, controllers,
    statistics and output. The engine calls start(), then plan() / settle() once per step.
    on_text gets the text as it comes; on_piece (instead) the text with its tokens' logprobs."""

    def __init__(self, engine, seq_id: int, prompt_tokens: Sequence[int], config: GenerationConfig,
                 on_text: TextCallback | None, on_piece: PieceCallback | None = None):
        # engine: the SpecEngine that owns the target context and the drafter
        target = engine.target
        self.engine, self.seq_id, self.config = engine, seq_id, config
        self.params = config.sampling
        self.verify_rng, self.draft_rng = random_streams(self.params.seed)
        self.stats = SpecStats(prompt_tokens=len(prompt_tokens))
        self.n_prompt = len(prompt_tokens)
        prompt = list(prompt_tokens) or ([target.bos] if target.bos >= 0 else [])
        self.history = prompt
        reproducible = self.params.seed is not None and not self.params.greedy
        if reproducible and engine.drafter is not None:
            engine.drafter.steady(seq_id)   # a draft model loading beside the steps waits for it
        self.ctls = engine.controllers_for(config, reproducible=reproducible, n_prompt=len(prompt))
        engine.last_controllers = self.ctls
        if on_piece is None and on_text is not None:
            on_piece = lambda text, from_draft, source, _lps: on_text(text, from_draft, source)  # noqa: E731
        self.out = _Output(target, config.max_tokens, config.stop, on_piece)
        self.done = False
        self.n_past = 0
        self._draft = NO_DRAFT
        self._state = None
        self.rules: Constraints | None = None   # logit_bias / grammar / logprobs: made at begin()
        self._draft_s = self._verify_s = 0.0
        self._timed: set[str] = set()   # drafters whose drafting time the controllers have learnt
        self._t_gen = 0.0
        self._clock0 = 0.0
        self._t0 = 0.0
        self._began = False
        self.prefilling = False   # begun, first token not sampled yet

    def start(self) -> None:
        """Evaluate the prompt (reusing a cached common prefix) and sample the first token."""
        ctx = self.engine.ctx
        self.begin()
        opening = self._opening()
        if opening:
            return self._open_with(opening)
        n_out = ctx.decode(self.history[self.n_past:], self.n_past, self.seq_id, outputs="last")
        self.prefilled(len(self.history) - self.n_past, ctx.logits(n_out)[0])

    def _opening(self) -> Draft:
        """A draft of the reply's first tokens, verified in the prompt's own batch: the text a
        grammar forces before the model has chosen anything (`{"name": "` of a schema's first key),
        which would otherwise cost the first steps after the prompt. Asked of the drafters that
        can draft before the first token (`Drafter.opening`), under a grammar only."""
        eng, c = self.engine, self.config
        # (not with a drafter that reads the target's decodes (MTP, EAGLE-3, DFlash): it expects the
        # prompt's batch to be the prompt; nor where a draft's rows cannot be cut from the memory)
        if (eng.drafter is None or self.rules is None or self.rules.grammar is None
                or eng.target.needs_checkpoints or eng.ctx.has_decode_listeners or not self.history):
            return NO_DRAFT
        # Only the last n_batch chunk of a decode has output rows: the draft and the prompt's last
        # token must share the chunk the prompt ends in, so the draft gets that chunk's free room
        # (none when the prompt fills it) and the prompt is chunked as plain decoding chunks it.
        n_batch, rest = eng.ctx.n_batch, len(self.history) - self.n_past
        room = n_batch - ((rest - 1) % n_batch + 1)
        k = min(c.draft_max, c.max_tokens - 1, eng.ctx.n_ctx_seq - len(self.history), room)
        if k <= 0:
            return NO_DRAFT
        return self.rules.cut_draft(eng.drafter.opening(self.seq_id, self.history, k).truncated(k))

    def _open_with(self, draft: Draft) -> None:
        """Evaluate the prompt and `draft` in one batch; the prompt's last token is the `last` of a
        first step that verifies the draft (settle: the first token, and what of the draft holds)."""
        ctx = self.engine.ctx
        rest = self.history[self.n_past:]
        n_out = ctx.decode(rest + draft.tokens, self.n_past, self.seq_id, outputs=len(draft) + 1)
        rows = ctx.logits(n_out)
        self._generation_begins()   # (the drafter's begin after the prompt's decode)
        eng = self.engine
        author = next((m for m in eng.drafter.members() if m.name == draft.source), None)
        if author is not None:   # a chain credits its member as the step's winner
            eng.drafter.drafted_by(self.seq_id, author)
        self.n_past = len(self.history) - 1   # the KV holds the prompt and the draft: settle cuts it
        self._draft, self._draft_s, self._state = draft, 0.0, None
        self.settle(rows, 0.0, timed=False)

    # Chunked prefill: begin(), then prefill_segment(n) / prefilled(n, row) in shared steps until
    # the last chunk brings the first token. start() is the same in one go.
    def begin(self) -> None:
        """Reuse the longest cached prefix of the prompt; the rest is left to evaluate
        (`prompt_left` tokens, from position n_past)."""
        eng, ctx, prompt = self.engine, self.engine.ctx, self.history
        self._t0 = time.perf_counter()
        if len(prompt) > ctx.n_ctx_seq:   # as decode would say, before any chunk shares a step
            raise ContextFullError(f"context full: {len(prompt)} tokens needed, context size is {ctx.n_ctx_seq}",
                                   "raise --ctx-size or shorten the prompt / -n")
        c = self.config
        if c.grammar is not None or c.logit_bias or c.logprobs is not None:   # (a bad one fails the start)
            self.rules = Constraints(eng.target, c, self.stats)
            if self.rules.grammar is not None:   # the live state, for the drafters (bind_grammars)
                eng.grammars[self.seq_id] = self.rules.grammar
        cached = eng.cached.pop(self.seq_id, [])
        keep = common_prefix(cached, prompt, limit=len(prompt) - 1)  # the last one is evaluated for its logits
        if eng.drafter is not None:  # a drafter fed by the target's hidden states may need some again
            keep = max(0, min(keep, eng.drafter.reuse_prefix(self.seq_id, prompt, keep)))
        if not (keep and ctx.seq_rm(self.seq_id, keep, -1)):
            keep = 0  # nothing shared, or a recurrent memory that cannot be cut: start over
            ctx.seq_rm(self.seq_id, 0, -1)
        self.stats.prompt_cached = keep   # evaluated: n_prompt - keep (a chat's next turn: its new tokens)
        self.n_past = keep
        self.prefilling = True

    @property
    def prompt_left(self) -> int:
        """Prompt tokens not evaluated yet (0 once the first token is sampled)."""
        return len(self.history) - self.n_past if self.prefilling else 0

    def prefill_segment(self, n: int) -> tuple[list[int], int, int]:
        """The batch segment of the next n prompt tokens."""
        return self.history[self.n_past:self.n_past + n], self.n_past, self.seq_id

    def prefilled(self, n: int, row: np.ndarray | None) -> None:
        """n more prompt tokens are in the KV; `row`: the last prompt token's logits, once it is."""
        self.n_past += n
        if row is None:
            return
        eng, ctx, prompt = self.engine, self.engine.ctx, self.history
        if self.rules is None:
            first = eng.sample_plain(self._allowed(row), prompt, self.params, self.verify_rng)
        else:
            first = self.rules.first(eng, self._allowed(row), prompt, self.params, self.verify_rng)
        self._generation_begins()
        self.n_past = len(prompt)  # tokens in the target KV; history[-1] is not among them
        self.done = self.config.max_tokens <= 0 or self.out.emit([first], 0, "")
        if self.rules is not None:
            self.rules.emitted(row[None, :], [first], 0, len(self.out.tokens))
        self._deliver()
        self.history.append(first)
        if eng.drafter is not None:
            eng.drafter.accepted(self.seq_id, 0, [first], is_other=True)
        if not self.done and self.n_past + 1 > ctx.n_ctx_seq:
            self.stop("context")

    def _generation_begins(self) -> None:
        """The prompt is evaluated: the drafter begins the sequence, and generation time starts."""
        self.prefilling = False
        if self.engine.drafter is not None:
            self.engine.drafter.begin(self.seq_id, self.history, self.draft_rng)
            self._began = True
        self._t_gen = time.perf_counter()
        self.stats.prompt_seconds = self._t_gen - self._t0
        self._clock0 = DecodeClock.seconds

    def stop(self, reason: str) -> None:
        self.out.stop_reason = reason
        self.done = True

    def plan(self, k_max: int) -> tuple[list[int], int, int]:
        """This step's draft; returns the batch segment ([last] + draft, start position, seq id)."""
        k = self.draft_room(k_max)
        ta = time.perf_counter()
        draft = self.engine.propose(self.seq_id, self.history, k, self.ctls, self.config.draft_min, self.stats)
        return self.planned(draft, time.perf_counter() - ta)

    def draft_room(self, k_max: int) -> int:
        """The most draft tokens this step may have (the step's part of the batch, -n, context)."""
        room = self.engine.ctx.n_ctx_seq - self.n_past - 1
        if room < 0:
            raise ContextFullError(f"context full: {self.n_past + 1} tokens needed, context size is "
                                   f"{self.engine.ctx.n_ctx_seq}", "raise --ctx-size or shorten the prompt / -n")
        return min(self.config.draft_max, self.config.max_tokens - len(self.out.tokens) - 1, room, k_max)

    def planned(self, draft: Draft, draft_seconds: float) -> tuple[list[int], int, int]:
        """Take this step's draft (drafted in `draft_seconds`); returns the batch segment."""
        if self.rules is not None:   # cut at the first token the grammar refuses: no row for it
            draft = self.rules.cut_draft(draft)
        self._draft, self._draft_s = draft, draft_seconds
        d = self._draft.tokens
        self._state = self.engine.ctx.save_seq(self.seq_id) if (d and self.engine.target.needs_checkpoints) else None
        return [self.history[-1]] + d, self.n_past, self.seq_id

    def price_by(self, shared) -> None:
        """Price this step's drafts by `shared` (costs.shared_step_ratios) while sharing the step
        with other rows, by the controllers' own measurements when alone (None)."""
        for ctl in self.ctls.values():
            ctl.cost.shared = shared

    def settle(self, rows: np.ndarray, verify_seconds: float, timed: bool = True) -> None:
        """Verify this sequence's rows, drop its rejected positions, emit, learn (the step's cost
        too unless not `timed`: the opening draft's batch is mostly the prompt)."""
        eng, ctx, draft = self.engine, self.engine.ctx, self._draft
        d, last = draft.tokens, self.history[-1]
        t0 = time.perf_counter()
        if self.rules is None:
            n_acc, nxt = eng.verify(d, draft, self._allowed(rows), self.history, self.params, self.verify_rng)
        else:
            n_acc, nxt = self.rules.verify(eng, d, draft, self._allowed(rows), self.history, self.params,
                                           self.verify_rng)
            if self.rules.logprobs is not None:   # (the rows are a view a replay decode may overwrite)
                rows = rows[:n_acc + 1].copy()
        if n_acc < len(d):
            if self._state is None:
                ctx.seq_rm(self.seq_id, self.n_past + 1 + n_acc, -1)
            else:  # recurrent state cannot be cut: restore the checkpoint, replay the accepted part
                ctx.load_seq(self._state, self.seq_id)
                ctx.decode([last] + d[:n_acc], self.n_past, self.seq_id, outputs=0)
        self._state = None
        verify_s = verify_seconds + time.perf_counter() - t0
        self._verify_s += verify_s
        self.stats.draft_seconds += self._draft_s
        new = d[:n_acc] + [nxt]
        self.n_past += 1 + n_acc
        self.history.extend(new)
        before = len(self.out.tokens)
        self.done = self.out.emit(new, n_acc, draft.source)
        if self.rules is not None:
            self.rules.emitted(rows, new, n_acc, len(self.out.tokens) - before)
        self._deliver()
        self.stats.record_step(len(d), n_acc, len(self.out.tokens) - before, draft.source)
        # A drafter's first draft of a sequence also evaluates what it deferred (a draft model's
        # prompt): timed as drafting, it would price every later draft token at many.
        first = bool(d) and draft.source not in self._timed
        self._timed.add(draft.source)
        _observe(self.ctls, draft, n_acc, verify_seconds=verify_s if timed else None,
                 draft_seconds=None if first or not timed else self._draft_s)
        if eng.drafter is not None:
            eng.drafter.accepted(self.seq_id, n_acc, new, is_other=not d)
        if not self.done and self.n_past + 1 > ctx.n_ctx_seq:
            self.stop("context")

    def _deliver(self) -> None:
        """The step's text goes out now that its tokens' logprobs exist (emitted: after the text)."""
        self.out.deliver(self.rules.logprobs if self.rules is not None else None)

    def _allowed(self, rows: np.ndarray) -> np.ndarray:
        """The target's logits as this sequence may sample them (ignore_eos: no end-of-generation)."""
        return self.engine.without_eog(rows) if self.config.ignore_eos else rows

    def finish(self) -> Generation:
        """End the sequence: drafter state dropped, held-back text flushed, timings filled in."""
        eng = self.engine
        if self._began:
            eng.drafter.end(self.seq_id)
            self._began = False
        logprobs = self.rules.logprobs if self.rules is not None else None
        self._drop_rules()
        # What the target's KV holds now (history[-1] was never evaluated): the next prompt on
        # this sequence id may reuse its prefix.
        eng.cached[self.seq_id] = self.history[:self.n_past]
        self.out.finish()
        self.out.deliver(logprobs)
        s = self.stats
        s.gen_seconds = time.perf_counter() - self._t_gen if self._t_gen else 0.0
        s.verify_seconds = self._verify_s
        # Overhead: generation wall time not spent inside llama_decode (target or draft); with
        # several sequences at once the decode time is shared, so this is a lower bound.
        s.overhead_seconds = max(0.0, s.gen_seconds - (DecodeClock.seconds - self._clock0))
        return Generation(self.out.tokens, "".join(self.out.parts), self.n_prompt, self.out.stop_reason, s, logprobs)

    def abandon(self) -> None:
        """Drop the sequence without a result (interrupted, or its prompt failed)."""
        if self._began:
            self.engine.drafter.end(self.seq_id)
            self._began = False
        self._drop_rules()
        self.engine.cached.pop(self.seq_id, None)
        self.engine.ctx.seq_rm(self.seq_id, 0, -1)

    def _drop_rules(self) -> None:
        if self.rules is not None:
            if self.rules.grammar is not None and self.engine.grammars.get(self.seq_id) is self.rules.grammar:
                del self.engine.grammars[self.seq_id]
            self.rules.close()
            self.rules = None


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
    verify_ss, draft_ss = np.random.SeedSequence(seed_entropy(seed)).spawn(2)   # (negative int64s too)
    return np.random.default_rng(verify_ss), np.random.default_rng(draft_ss)


def _observe(ctls: dict[str, DraftLengthController], draft: Draft, n_acc: int, *,
             verify_seconds: float | None, draft_seconds: float | None) -> None:
    """Feed a step to the controllers: the author of the draft learns its acceptance, the others
    only the target's step cost; after a plain step every controller sees it as one."""
    if not ctls:
        return
    count_steps(ctls)
    n = len(draft)
    author = ctls.get(draft.source) if n else None
    if n and author is None and len(ctls) == 1:
        author = next(iter(ctls.values()))
    for ctl in ctls.values():
        if not n:
            ctl.observe(0, 0, verify_seconds=verify_seconds, draft_seconds=draft_seconds)
        elif ctl is author:
            ctl.observe(n, n_acc, verify_seconds=verify_seconds, draft_seconds=draft_seconds)
        elif verify_seconds is not None:   # (None: an untimed step, the opening draft's)
            ctl.observe_cost(n + 1, verify_seconds)


NO_DRAFT = Draft([])


def valid_prefix(draft: Draft, n_vocab: int) -> Draft:
    """The draft up to its first token id the target does not have (such a token is rejected anyway)."""
    n = next(i for i, t in enumerate(draft.tokens) if t >= n_vocab)
    return draft.truncated(n)


def recent_tokens(history: Sequence[int], params: SamplingParams) -> Sequence[int]:
    if not params.penalties_on:
        return ()
    n = params.repeat_last_n
    return history[-n:] if n > 0 else history
