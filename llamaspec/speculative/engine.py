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

A sequence generating under a grammar or a logit_bias, or asked for logprobs, hands its rows to
its `Constraints` (constrained.py: llama.cpp's sampling under a grammar, drafts cut at the first
refused token); the paths above stay as they are for the others.

Sequence ids are explicit throughout: `generate_many` decodes several sequences together, the
verify rows of all of them in one llama_decode per step.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from llamaspec.speculative.controller import CostModel, DraftLengthController
from llamaspec.speculative import curve_memo
from llamaspec.speculative.costs import marginal_charges, shared_step_ratios
from llamaspec.speculative.match_controller import MatchController, RiskBudget
from llamaspec.speculative.sequence import (  # noqa: F401  (GenerationConfig & co. are the engine's API too)
    NO_DRAFT,
    Generation,
    GenerationConfig,
    SequenceRun,
    StopReason,  # noqa: F401
    StopStrings,  # noqa: F401
    TextCallback,
    EogSet,
    recent_tokens,
    valid_prefix,
)
from llamaspec.speculative.drafters.base import Draft, Drafter
from llamaspec.speculative.prefix import common_prefix
from llamaspec.speculative.prompt_cache import PromptCache, swap_in
from llamaspec.errors import LlamaspecError
from llamaspec.runtime.llama import Model, default_threads
from llamaspec.runtime.context import Context
from llamaspec.speculative.metrics import SpecStats
from llamaspec.speculative.verify import (
    SamplingParams,
    sample_token,
    step_sampler,
    target_distribution,
    verify_greedy,
    verify_rejection,
    verify_sample_and_match,
)


class SpecEngine:
    """Generates with one target context and an optional drafter; models stay loaded across calls.

    `generate` runs one sequence; `generate_many` runs up to `parallel` sequences at once, their
    verify rows in one llama_decode per step, each with its own drafter state, controllers and
    stop conditions, refilled from the queue as sequences finish. Both drive the same `SequenceRun`
    steps, so one sequence is one sequence either way.
    """

    def __init__(self, target: Model, ctx: Context, drafter: Drafter | None = None):
        self.target = target
        self.ctx = ctx
        self.drafter = drafter
        self.eog = EogSet(target)
        self._eog_ids: np.ndarray | None = None
        # The adaptive controllers of the last sequence started, one per drafter (by name).
        self.last_controllers: dict[str, DraftLengthController] = {}
        # Tokens each sequence id holds in the target's KV cache: a new prompt reuses the common
        # prefix (a shared system prompt) instead of evaluating it again.
        self.cached: dict[int, list[int]] = {}
        # generate_many's RAM prompt cache (batch --cache-ram, as llama-server's): a sequence id's
        # KV saved before a different prompt cuts it, restored for a prompt sharing more of it
        self.prompt_cache: PromptCache | None = None
        # This target's verify curve (a lone sequence's step times by batch size): kept from
        # earlier runs (curve_memo.py), then measured over this engine's sequences. A new
        # sequence's controllers price their first drafts by it, not by a prior line. Plain
        # decoding (no drafter) neither reads nor keeps one.
        self._curve_key = (curve_memo.key(target.path, ctx.config.n_threads or default_threads(), target.n_gpu_layers)
                           if drafter is not None else None)
        self._lone_cost = CostModel(prior=curve_memo.load(self._curve_key))
        # Times of whole multi-sequence batches: the curve that prices each sequence's draft rows.
        self._batch_cost = CostModel(prior=self._lone_cost.prior)
        # Each copying drafter's loss budget, kept across sequences (match_controller.RiskBudget).
        self._risk: dict[str, RiskBudget] = {}
        # The live grammar state of each sequence generating under one (seq_id -> GrammarState,
        # advanced by the emitted tokens only): drafters read it to cut or make drafts.
        self.grammars: dict = {}
        if drafter is not None:
            drafter.bind_grammars(self.grammars)

    def generate(self, prompt_tokens: Sequence[int], config: GenerationConfig,
                 on_text: TextCallback | None = None, seq_id: int = 0,
                 should_stop: Callable[[], bool] | None = None) -> Generation:
        seq = SequenceRun(self, seq_id, prompt_tokens, config, on_text)
        try:
            seq.start()
            while not seq.done:
                if should_stop is not None and should_stop():
                    seq.stop("interrupted")
                    break
                self.step([seq])
        except KeyboardInterrupt:
            seq.stop("interrupted")
        return seq.finish()

    def generate_many(self, jobs: Iterable[tuple[str, Sequence[int], GenerationConfig]], *, parallel: int = 1,
                      should_stop: Callable[[], bool] | None = None
                      ) -> Iterator[tuple[str, Generation | LlamaspecError]]:
        """(key, prompt tokens, config) jobs -> (key, Generation) as each finishes; (key, error)
        for a job that cannot start (its prompt does not fit the context), the others go on.

        Up to `parallel` sequences (sequence ids 0..parallel-1; the context must have been made
        with n_seq_max >= parallel) share each target decode. Ctrl-C (KeyboardInterrupt) and
        should_stop() end the unfinished sequences without a result: they are not yielded.
        """
        if parallel > self.ctx.config.n_seq_max:
            raise ValueError(f"parallel {parallel} > the context's n_seq_max {self.ctx.config.n_seq_max}")
        queue = iter(jobs)
        free = list(range(parallel - 1, -1, -1))
        active: list[tuple[str, SequenceRun]] = []
        exhausted = False
        try:
            while True:
                while free and not exhausted:
                    job = next(queue, None)
                    if job is None:
                        exhausted = True
                        break
                    key, prompt, config = job
                    seq_id = free.pop()
                    if self.prompt_cache is not None:   # a saved prompt sharing more of this one: restored
                        here = common_prefix(self.cached.get(seq_id, []), prompt, limit=len(prompt) - 1)
                        swap_in(self.prompt_cache, self, seq_id, list(prompt), here)
                    seq = SequenceRun(self, seq_id, prompt, config, None)
                    try:
                        seq.start()
                    except LlamaspecError as e:  # this prompt cannot run (too long for the context)
                        seq.abandon()
                        free.append(seq.seq_id)
                        yield key, e
                        continue
                    except BaseException:
                        seq.abandon()
                        free.append(seq.seq_id)
                        raise
                    active.append((key, seq))
                done = [(key, s) for key, s in active if s.done]
                for key, s in done:
                    active.remove((key, s))
                    free.append(s.seq_id)
                    yield key, s.finish()
                if not active:
                    if exhausted:
                        return
                    continue
                if should_stop is not None and should_stop():
                    return
                self.step([s for _, s in active])
        finally:
            for _, s in active:
                s.abandon()

    # -- one step of every active sequence -------------------------------------------------------
    def step(self, seqs: list["SequenceRun"], prefill: Sequence[tuple["SequenceRun", int]] = ()) -> None:
        """Draft for each sequence, verify all of them in one target batch, keep what was accepted.

        prefill: (sequence, n) for sequences still being admitted (`SequenceRun.begin`): their next
        n prompt tokens ride in the same batch (chunked prefill, as llama-server mixes prompt
        chunks into its decode batches), so the sequences generating keep going meanwhile."""
        n_prompt = sum(n for _, n in prefill)
        # [last] + draft of every sequence, with the prompt chunks, fits one batch
        budget = (self.ctx.n_batch - n_prompt) // len(seqs) if seqs else 0
        # Sharing the step, a sequence's drafts are priced by the shared batch's curve: what its
        # rows add to the step against its share of a plain one (costs.shared_step_ratios).
        shared = (shared_step_ratios(self._batch_cost, len(seqs), len(seqs) + n_prompt)
                  if len(seqs) > 1 or (seqs and n_prompt) else None)
        for s in seqs:
            s.price_by(shared)
        batcher = self.drafter.batch_member() if len(seqs) > 1 and self.drafter is not None else None
        if batcher is not None and not any(s.seq_id in self.grammars for s in seqs):
            segments = self._plan_together(seqs, budget - 1, batcher)
        else:
            segments = [s.plan(budget - 1) for s in seqs]
        chunks = [s.prefill_segment(n) for s, n in prefill]
        tb = time.perf_counter()
        if len(seqs) == 1 and not chunks:
            toks, start, seq_id = segments[0]
            n_out = self.ctx.decode(toks, start, seq_id, outputs="all")
            rows, firsts = self.ctx.logits(n_out), [0]
        else:   # a prompt chunk has one output row, its last token's, once it ends the prompt
            outs = [len(t) for t, _, _ in segments] + [int(n == s.prompt_left) for s, n in prefill]
            firsts = self.ctx.decode_many(segments + chunks, outputs=outs)
            rows = self.ctx.logits(sum(outs))
        verify_s = time.perf_counter() - tb
        for (s, n), first in zip(prefill, firsts[len(segments):]):
            s.prefilled(n, rows[first] if n == s.prompt_left else None)
        # One batch for all: each sequence is charged a plain row's part of it plus the marginal
        # cost of its draft rows (marginal_charges), in its stats and in what its controller's
        # cost model learns. The whole time once per sequence made a one-token step look N times
        # dearer; the rows' share priced k draft tokens at k + 1 plain steps, on any curve.
        lengths = [len(t) for t, _, _ in segments]
        total = sum(lengths) + n_prompt
        if len(seqs) > 1 or chunks:
            if not chunks:   # a prompt chunk's rows have no logits: cheaper than verify rows
                self._batch_cost.observe_verify(total, verify_s)
            charges = marginal_charges(lengths, n_prompt, verify_s, self._batch_cost.batch_curve(total))
        else:
            charges = [verify_s]
            if self.drafter is not None:   # the curve a drafter's first drafts are priced by
                self._lone_cost.observe_verify(total, verify_s)
        for s, first, n, charge in zip(seqs, firsts, lengths, charges):
            s.settle(rows[first:first + n], charge)

    # -- helpers shared by the sequences -----------------------------------------------------------
    def verify_curve(self) -> "curve_memo.Curve":
        """((n, t(n)/t(1), timings), ...) of this target as known now: measured by this engine's
        lone steps, else kept from earlier runs."""
        return curve_memo.merge(self._lone_cost.prior, self._lone_cost.measured_curve())

    def keep_curve(self) -> None:
        """Keep what this engine measured of the curve for the next run (Pipeline.close)."""
        measured = self._lone_cost.measured_curve()
        if measured:
            curve_memo.save(self._curve_key, measured)

    def controllers_for(self, config: GenerationConfig, reproducible: bool,
                        n_prompt: int = 0) -> dict[str, DraftLengthController]:
        """One adaptive controller per drafter (chain members each get their own), for this
        sequence: a paused draft model must not stop a free n-gram drafter from being tried.

        reproducible (a seed at T > 0): a sampled draft is verified by rejection sampling, whose
        random draws depend on which positions were drafted, so the draft lengths must not follow
        measured time, or one seed would give different outputs from run to run. Then every
        drafter decides from acceptance and fixed costs (a verify batch at the default slope,
        drafting at the drafter's size-based `cost_hint`). n_prompt: the sequence's prompt length,
        what a draft model evaluates before its first draft (its controller prices that probe)."""
        if self.drafter is None or not config.adaptive or config.draft_max <= 0:
            return {}
        members = self.drafter.members()
        # In a chain, who drafts a position decides how it is verified: all members, then.
        fixed = reproducible and any(d.samples for d in members)
        n_min, n_max = max(1, config.draft_min), config.draft_max
        curve = self.verify_curve()

        ctls = {}
        for d in members:
            # a drafter that re-reads text to draft (a draft model) reads the prompt first
            def make(c: CostModel | None, prior_alpha: float = 0.6, resume: int = d.resume_tokens) -> DraftLengthController:
                return DraftLengthController(n_min=n_min, n_max=n_max, cost=c, prior_alpha=prior_alpha,
                                             resume_tokens=resume, first_resume=n_prompt if resume else 0)

            cost = CostModel(draft_ratio_prior=d.measured_cost, prior=curve, draft_seconds=d.draft_token_seconds)
            if fixed:
                slope = CostModel().default_slope
                cost = CostModel(verify_ratio_fn=lambda k, s=slope: (1.0 + s * (k + 1)) / (1.0 + s),
                                 draft_ratio_value=d.cost_hint)
            risk = self._risk.setdefault(d.name, RiskBudget()) if d.bounded_risk else RiskBudget.unbounded()
            ctls[d.name] = MatchController(make, cost, risk=risk) if d.sizes_by_match else make(cost)
        return ctls

    def _plan_together(self, seqs: list["SequenceRun"], k_max: int, drafter: Drafter) -> list[tuple[list[int], int, int]]:
        """`plan` of every sequence, their drafts made together by `drafter` (a draft model's
        propose_many: one draft decode per position for all of them; a member of the engine's
        chain, credited as its winner). Each sequence's length is its controller's choice, as in
        `propose`; the drafting time is shared equally by those that drafted."""
        asks = []
        for s in seqs:
            k = s.draft_room(k_max)
            n = min(k, s.ctls[drafter.name].choose(None)) if k > 0 and s.ctls else k
            asks.append((k, n))
        wanted = [(s.seq_id, s.history, n) for s, (_, n) in zip(seqs, asks) if n > 0]
        t0 = time.perf_counter()
        drafts = iter(drafter.propose_many(wanted) if wanted else ())
        share = (time.perf_counter() - t0) / max(1, len(wanted))
        segments = []
        for s, (k, n) in zip(seqs, asks):
            draft = self._shaped(next(drafts).truncated(n), k, s.config.draft_min) if n > 0 else NO_DRAFT
            if n > 0:
                s.stats.record_call(drafter.name, share)
                if drafter is not self.drafter:
                    self.drafter.drafted_by(s.seq_id, drafter)
            segments.append(s.planned(draft, share if n > 0 else 0.0))
        return segments

    def _shaped(self, draft: Draft, k: int, draft_min: int) -> Draft:
        """A drafter's proposal cut to what the step can take."""
        if len(draft) > k:
            draft = draft.truncated(k)
        # llama.cpp drops drafts shorter than --draft-min. Not a sampled draft verified by rejection
        # sampling: its length depends on its tokens, so dropping the short ones would keep drafts
        # by their tokens and bias the output. Such a draft is verified whatever its length.
        if 0 < len(draft) < draft_min and draft.probs is None:
            return NO_DRAFT
        if draft and max(draft.tokens) >= self.target.n_vocab:
            draft = valid_prefix(draft, self.target.n_vocab)  # a forced foreign-vocab draft
        return draft

    def propose(self, seq_id: int, history: list[int], k: int,
                 ctls: dict[str, DraftLengthController], draft_min: int, stats: SpecStats) -> Draft:
        """The drafter's proposal for this step, cut to k tokens (an empty Draft: a plain step).
        Each drafter asked (a chain asks its members in turn) is timed into `stats`."""
        if self.drafter is None or k <= 0:
            return NO_DRAFT
        asked: list[tuple[str, float]] = []  # (member, when asked): a member's time runs to the next

        def start(d: Drafter) -> None:  # one call per member asked, whether it finds a draft or not
            if not asked or asked[-1][0] != d.name:
                asked.append((d.name, time.perf_counter()))

        def limit(d: Drafter, match: int | None = None) -> int:
            n = min(k, ctls[d.name].choose(match)) if ctls else k
            if n > 0:
                start(d)
            return n

        limit.start = start  # type: ignore[attr-defined]  # base.announce: a member that looks first

        draft = self.drafter.propose_within(seq_id, history, limit)
        t_end = time.perf_counter()
        for i, (name, t) in enumerate(asked):
            stats.record_call(name, (asked[i + 1][1] if i + 1 < len(asked) else t_end) - t)
        return self._shaped(draft, k, draft_min)

    # -- sampling / verification ---------------------------------------------------------------
    def without_eog(self, rows: np.ndarray) -> np.ndarray:
        """`rows` (logits, one row or several) with every end-of-generation token at -inf."""
        if self._eog_ids is None:   # (once: a pass over the vocabulary)
            self._eog_ids = np.array([t for t in range(self.target.n_vocab) if self.target.is_eog(t)], dtype=np.int64)
        out = np.array(rows, copy=True)
        out[..., self._eog_ids] = -np.inf
        return out

    @staticmethod
    def sample_plain(row: np.ndarray, history: Sequence[int], params: SamplingParams,
                      rng: np.random.Generator) -> int:
        if params.greedy and not params.penalties_on:
            return int(row.argmax())
        return sample_token(row, params, recent_tokens(history, params), rng)

    def verify(self, d: list[int], draft: Draft, rows: np.ndarray, history: Sequence[int],
                params: SamplingParams, rng: np.random.Generator) -> tuple[int, int]:
        eog = self.eog
        if params.greedy and not params.penalties_on:
            if not d:
                return 0, int(rows[0].argmax())
            return verify_greedy(d, rows, eog)
        if not params.greedy and draft.probs is not None and d:
            recent = list(recent_tokens(history, params))
            p_rows = [target_distribution(rows[i], params, recent + d[:i]) for i in range(len(d) + 1)]
            return verify_rejection(d, draft.probs, p_rows, rng, eog)
        return verify_sample_and_match(d, rows, step_sampler(params, history, d, rng), eog)
