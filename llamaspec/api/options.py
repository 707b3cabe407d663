"""What flows from the command line (or a script) into a `Generator`: one typed object.

`cli/_generation.py` builds it once from `run`'s and `batch`'s flags; `Generator.from_options`
takes it. Its sampling part is the engine's own `SamplingParams` (validated when made), the type
that per-request settings and the server share.

    >>> from llamaspec.speculative.sampling_params import SamplingParams
    >>> opts = GenerationOptions(spec_type="ngram-mod", sampling=SamplingParams(temperature=0))
    >>> opts.sampling.greedy, opts.max_tokens == NO_LIMIT   # max_tokens left out: no limit
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from llamaspec import knobs
from llamaspec.errors import UsageError
from llamaspec.knobs import DEFAULT
from llamaspec.openai.fields import NO_LIMIT, parse_stop
from llamaspec.speculative.sampling_params import SamplingParams

if TYPE_CHECKING:
    from llamaspec.runtime.grammar import GrammarSpec
    from llamaspec.speculative.options import NgramParams


@dataclass(frozen=True)
class GenerationOptions:
    """Everything but the target model: drafting, loading, sampling and prompt formatting.

    draft: a path, Hub reference, "auto" or None (the default: auto without downloads).
    spec_type: llama.cpp's --spec-type value ("ngram-mod", "draft,ngram-simple"; "none": plain).
    draft_max None: the resolved default for the spec type. adaptive False is --fixed-draft.
    n_gpu_layers(_draft) None: offload what fits (-1: every layer). parallel: sequences in one context.
    sampling, max_tokens and stop are defaults that each request may override. max_tokens None or
    -1: no limit (until end-of-generation or a full context; kept as NO_LIMIT). grammar: the
    constraint of every request that sets none (--grammar, -j/--json-schema; runtime/grammar.py).
    """

    # drafting
    draft: str | Path | None = None
    spec_type: str | None = None
    draft_max: int | None = DEFAULT.draft_max
    draft_min: int = DEFAULT.draft_min
    draft_p_min: float = DEFAULT.draft_p_min
    adaptive: bool = True
    ngram: "NgramParams | None" = None
    force_draft: bool = False
    spec_replace: Sequence[tuple[str, str]] = ()   # translated drafting: (target text, draft text) pairs
    search: Sequence[Path] = ()
    offline: bool = False
    # loading
    ctx_size: int | None = None
    threads: int | None = None
    n_gpu_layers: int | None = None
    n_gpu_layers_draft: int | None = None
    amx: bool | None = None
    parallel: int = 1
    cache_ram_mib: int = 0   # generate_many's RAM prompt cache (batch --cache-ram): MiB, -1 no limit, 0 off
    # sampling and output
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = DEFAULT.max_tokens
    stop: Sequence[str] = ()
    grammar: "GrammarSpec | None" = None
    ignore_eos: bool = False                       # every request generates past end-of-generation
    logit_bias: "Mapping[int, float] | None" = None   # of every request that sets none (ids checked at load)
    # prompt formatting
    chat: bool | None = None
    system: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.parallel, bool) or not isinstance(self.parallel, int) or self.parallel < 1:
            raise UsageError(f"parallel must be an integer >= 1, not {self.parallel!r}")
        object.__setattr__(self, "max_tokens", check_max_tokens(self.max_tokens))
        for name in knobs.DRAFTING:   # the knob table's ranges, then the one rule between the two lengths
            knobs.check(name, getattr(self, name))
        knobs.check_draft_min(self.draft_min, self.draft_max)
        object.__setattr__(self, "stop", check_stop(self.stop))
        if self.ignore_eos or self.logit_bias:   # the one parser's verdicts (openai/requests.py)
            from llamaspec.openai.requests import check_fields

            checked = check_fields({"ignore_eos": self.ignore_eos, "logit_bias": self.logit_bias or None})
            object.__setattr__(self, "ignore_eos", bool(checked.get("ignore_eos")))
            object.__setattr__(self, "logit_bias", checked.get("logit_bias"))
        if self.grammar is not None and not hasattr(self.grammar, "gbnf"):
            raise UsageError(f"grammar must be a GrammarSpec (runtime/grammar.py) or None, not {self.grammar!r}",
                             "build one with GrammarSpec(gbnf) or grammar_from_schema(schema)")


def check_max_tokens(value, name: str = "max_tokens") -> int:
    """A token limit -> an int: None and -1 (llama.cpp's -n -1) are no limit (NO_LIMIT, more than
    any context holds, so end-of-generation or the full context ends the answer).

        >>> check_max_tokens(8), check_max_tokens(-1) == check_max_tokens(None) == NO_LIMIT
        (8, True)
    """
    value = knobs.check("max_tokens", value, name)
    return NO_LIMIT if value is None or value == -1 else value


def check_stop(value, name: str = "stop") -> tuple[str, ...]:
    """A stop string or a list of them -> a tuple of non-empty strings, by the one rule of
    openai.fields.parse_stop (empty strings dropped; its RequestError is a UsageError)."""
    return tuple(parse_stop(value, name))
