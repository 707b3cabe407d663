"""Counters of a speculative run and the figures derived from them.

Definitions (the same as llama.cpp's `common_speculative_print_stats` and vLLM's spec-decode
metrics):

- step:      one target evaluation that yields >= 1 new token (a verify step, or a plain decode
             step when there was no draft).
- draft:     a step with a non-empty draft; `drafted` counts draft tokens, `accepted` the ones the
             target accepted.
- acceptance = accepted / drafted.
- mean accepted length = 1 + accepted / drafts: tokens gained per *verify step with a draft*,
  the bonus token included (llama.cpp: 1 + n_acc_tokens / n_call_accept, and accept is only
  called after a step with a draft; vLLM: 1 + num_accepted_tokens / num_drafts).
  `tokens_per_step` = generated / steps counts all steps, plain ones too.
- per-position acceptance[i] = (drafts whose token i was accepted) / drafts (llama.cpp's
  "acc rate/pos"); the raw counts `drafted_per_position` / `accepted_per_position` are kept too,
  so accepted[i] / drafted[i] (acceptance of position i among drafts that long) can be derived.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DrafterCredit", "SpecStats"]


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    out = list(a) + [0] * max(0, len(b) - len(a))
    for i, v in enumerate(b):
        out[i] += v
    return out


@dataclass
class DrafterCredit:
    """What one drafter contributed: llama.cpp's per-implementation counters."""

    calls: int = 0          # times it was asked for a draft (found one or not)
    drafts: int = 0         # non-empty drafts it produced (and that were used)
    drafted: int = 0        # tokens in those drafts
    accepted: int = 0       # of those, accepted by the target
    accepted_per_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0  # time spent in its propose()
    grammar_cut: int = 0    # its draft tokens cut before verification: the grammar refused them

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0

    def record_accepted(self, n_accepted: int) -> None:
        self.accepted += n_accepted
        apos = self.accepted_per_position
        if len(apos) < n_accepted:
            apos.extend([0] * (n_accepted - len(apos)))
        for i in range(n_accepted):
            apos[i] += 1

    def merge(self, other: "DrafterCredit") -> "DrafterCredit":
        return DrafterCredit(
            calls=self.calls + other.calls,
            drafts=self.drafts + other.drafts,
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            accepted_per_position=_add_lists(self.accepted_per_position, other.accepted_per_position),
            draft_seconds=self.draft_seconds + other.draft_seconds,
            grammar_cut=self.grammar_cut + other.grammar_cut,
        )

    def to_dict(self) -> dict:
        return {
            "calls": self.calls,
            "drafts": self.drafts,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "mean_accepted_length": self.mean_accepted_length,
            "per_position_acceptance": [a / self.drafts for a in self.accepted_per_position]
            if self.drafts else [],
            "draft_seconds": self.draft_seconds,
            "grammar_cut": self.grammar_cut,
        }


@dataclass
class SpecStats:
    """Counters of one sequence (or, after `merge`, of several).

    Fill it with `record_step` after each step and add timings to the *_seconds fields.
    Timings: prompt_seconds (prompt evaluation), gen_seconds (wall time of generation, prompt
    excluded), draft_seconds / verify_seconds (inside gen_seconds), overhead_seconds (generation
    time not spent inside llama_decode: the engine's and drafters' own Python work).
    """

    steps: int = 0
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    prompt_tokens: int = 0
    prompt_cached: int = 0      # prompt tokens found in the KV cache (a reused prefix), not evaluated
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    per_drafter: dict[str, DrafterCredit] = field(default_factory=dict)
    prompt_seconds: float = 0.0
    gen_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    overhead_seconds: float = 0.0
    # Under a grammar: draft tokens cut before verification (refused, from the first such token
    # on; not counted in `drafted`), and rows where the whole vocabulary had to be masked (the
    # chain's token was refused: llama.cpp's slow path).
    grammar_cut: int = 0
    grammar_masks: int = 0

    def record_step(self, n_drafted: int, n_accepted: int, n_new: int, source: str = "") -> None:
        """One step: `n_drafted` draft tokens verified, `n_accepted` accepted, `n_new` tokens appended
        (normally n_accepted + 1; fewer when generation stopped inside the step). `source` names the
        drafter of a non-empty draft (credited in `per_drafter`)."""
        if n_accepted > n_drafted:
            raise ValueError(f"accepted {n_accepted} > drafted {n_drafted}")
        self.steps += 1
        self.generated += n_new
        if n_drafted <= 0:
            return
        self.drafts += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        dpos, apos = self.drafted_per_position, self.accepted_per_position
        if len(dpos) < n_drafted:
            dpos.extend([0] * (n_drafted - len(dpos)))
            apos.extend([0] * (n_drafted - len(apos)))
        for i in range(n_drafted):
            dpos[i] += 1
        for i in range(n_accepted):
            apos[i] += 1
        if source:
            credit = self.per_drafter.get(source)
            if credit is None:
                credit = self.per_drafter[source] = DrafterCredit()
            credit.drafts += 1
            credit.drafted += n_drafted
            credit.record_accepted(n_accepted)

    def record_grammar_cut(self, source: str, n: int) -> None:
        """n draft tokens of drafter `source` cut before verification: the grammar refused them."""
        self.grammar_cut += n
        credit = self.per_drafter.get(source)
        if credit is None:
            credit = self.per_drafter[source] = DrafterCredit()
        credit.grammar_cut += n

    def record_call(self, source: str, seconds: float) -> None:
        """Drafter `source` was asked for a draft (drafted or not) and took `seconds`."""
        credit = self.per_drafter.get(source)
        if credit is None:
            credit = self.per_drafter[source] = DrafterCredit()
        credit.calls += 1
        credit.draft_seconds += seconds

    # -- derived ------------------------------------------------------------------------------

    @property
    def acceptance(self) -> float:
        """accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """1 + accepted / drafts, bonus token included (llama.cpp's and vLLM's definition);
        1.0 when there was no draft at all."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def tokens_per_step(self) -> float:
        """generated / steps, plain steps included."""
        return self.generated / self.steps if self.steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """[i] = drafts whose token i was accepted / drafts (llama.cpp's 'acc rate/pos')."""
        if not self.drafts:
            return []
        return [a / self.drafts for a in self.accepted_per_position]

    @property
    def tokens_per_second(self) -> float:
        """generated / gen_seconds (prompt time excluded)."""
        return self.generated / self.gen_seconds if self.gen_seconds > 0 else 0.0

    # -- combining and output -----------------------------------------------------------------

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Sum of two stats (e.g. of several sequences). Times add up: when sequences ran
        concurrently, set gen_seconds of the result to the wall time yourself."""
        drafters = {k: DrafterCredit().merge(v) for k, v in self.per_drafter.items()}
        for k, v in other.per_drafter.items():
            drafters[k] = drafters[k].merge(v) if k in drafters else DrafterCredit().merge(v)
        return SpecStats(
            steps=self.steps + other.steps,
            drafts=self.drafts + other.drafts,
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            generated=self.generated + other.generated,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            prompt_cached=self.prompt_cached + other.prompt_cached,
            drafted_per_position=_add_lists(self.drafted_per_position, other.drafted_per_position),
            accepted_per_position=_add_lists(self.accepted_per_position, other.accepted_per_position),
            per_drafter=drafters,
            prompt_seconds=self.prompt_seconds + other.prompt_seconds,
            gen_seconds=self.gen_seconds + other.gen_seconds,
            draft_seconds=self.draft_seconds + other.draft_seconds,
            verify_seconds=self.verify_seconds + other.verify_seconds,
            overhead_seconds=self.overhead_seconds + other.overhead_seconds,
            grammar_cut=self.grammar_cut + other.grammar_cut,
            grammar_masks=self.grammar_masks + other.grammar_masks,
        )

    __add__ = merge

    @classmethod
    def sum(cls, stats: "list[SpecStats]") -> "SpecStats":
        total = cls()
        for s in stats:
            total = total.merge(s)
        return total

    def to_dict(self) -> dict:
        return {
            "n_generated": self.generated,
            "prompt_tokens": self.prompt_tokens,
            "prompt_cached": self.prompt_cached,
            "steps": self.steps,
            "drafts": self.drafts,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "mean_accepted_length": self.mean_accepted_length,
            "tokens_per_step": self.tokens_per_step,
            "per_position_acceptance": self.per_position_acceptance,
            "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(self.accepted_per_position),
            "per_drafter": {k: v.to_dict() for k, v in self.per_drafter.items()},
            "prompt_seconds": self.prompt_seconds,
            "gen_seconds": self.gen_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "overhead_seconds": self.overhead_seconds,
            "tokens_per_second": self.tokens_per_second,
            "grammar_cut": self.grammar_cut,
            "grammar_masks": self.grammar_masks,
        }
