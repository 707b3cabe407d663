"""What the user asked for: the speculative types (one table), their settings, and the defaults.

`SPEC_TYPES` is the one table of llama.cpp's speculative types: the name llama.cpp uses, the
aliases people type, the chain priority, what a type needs loaded, its default draft length, the
flags llama.cpp's own example takes for it, and whether llamaspec implements it. Code that needs
to know something about a type asks the table (`needs_draft_model`, `loads_mtp_layers`, ...)
instead of comparing names; only the factory (drafters/factory.py) maps names to drafter classes.

Nothing here imports llama_cpp: `--help` builds its text from this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from llamaspec.errors import UsageError
from llamaspec.knobs import MAX_DRAFT   # (the longest draft one verify batch holds: the knob table's)

__all__ = [
    "SpecType", "SPEC_TYPES", "PRIORITY", "ALIASES", "DRAFT_MODEL_TYPE", "NgramParams", "SpecOptions",
    "DEFAULT_CTX", "MAX_DRAFT", "DRAFT_MAX_NGRAM", "DRAFT_MAX_MODEL",
    "canonical_name", "order_by_priority", "parse_spec_types", "check_implemented", "implemented_names",
    "default_draft_max", "needs_draft_model", "loads_mtp_layers", "default_bench_modes", "native_flags",
    "spec_type_help", "chain_joiners",
]

DEFAULT_CTX = 4096


# Draft length caps when the user gives none: n-gram drafts cost nothing to make, so long ones
# pay when the text repeats (measured on SmolLM2: k=32 won on an easy rewrite, 3.2x against 2.7x
# at k=8); a draft model pays per token.
DRAFT_MAX_NGRAM = 32
DRAFT_MAX_MODEL = 8

_NGRAM_SIMPLE_FLAGS = (("--spec-ngram-simple-size-n", "simple_size_n"),
                       ("--spec-ngram-simple-size-m", "simple_size_m"))
_NGRAM_MOD_FLAGS = (("--spec-ngram-mod-n-match", "mod_n_match"),
                    ("--spec-ngram-mod-n-min", "mod_n_min"),
                    ("--spec-ngram-mod-n-max", "mod_n_max"))
_NGRAM_MAP_K_FLAGS = (("--spec-ngram-map-k-size-n", "map_k_size_n"),
                      ("--spec-ngram-map-k-size-m", "map_k_size_m"),
                      ("--spec-ngram-map-k-min-hits", "map_k_min_hits"))
_NGRAM_MAP_K4V_FLAGS = (("--spec-ngram-map-k4v-size-n", "map_k4v_size_n"),
                        ("--spec-ngram-map-k4v-size-m", "map_k4v_size_m"),
                        ("--spec-ngram-map-k4v-min-hits", "map_k4v_min_hits"))


@dataclass(frozen=True)
class SpecType:
    """One of llama.cpp's speculative types (`--spec-type`)."""

    name: str                              # llama.cpp's name
    priority: float                        # llama.cpp's chain order (common_speculative_init): lower first
    aliases: tuple[str, ...] = ()          # names users type that llama.cpp does not accept
    needs_draft_model: bool = False        # a separate draft GGUF (--draft)
    loads_mtp_layers: bool = False         # the target is loaded with its NextN/MTP layers
    draft_max: int | None = None           # default --draft-max (None: does not draft)
    # llama.cpp flags for bench's side-by-side run: (flag, key of the value bench supplies)
    native_flags: tuple[tuple[str, str], ...] = ()
    implemented: bool = False              # llamaspec has a drafter for it
    in_llama_cpp: bool = True              # False: llamaspec's own type (llama.cpp would refuse it)
    # drafts only where a sequence's grammar forces text: it joins every chain (the factory adds
    # it), and has no draft_max of its own, so bench and tune do not measure it alone
    joins_every_chain: bool = False


#: llama.cpp's speculative types, in its chain priority order ("none" first: plain decoding)
SPEC_TYPES: dict[str, SpecType] = {t.name: t for t in (
    SpecType("none", 0, draft_max=None, implemented=True),
    # llamaspec's own: the text a grammar forces (drafters/grammar_jump.py), first: where the
    # grammar admits one continuation it is near certain, and elsewhere it proposes nothing
    SpecType("grammar", 0.5, implemented=True, in_llama_cpp=False, joins_every_chain=True),
    # llamaspec's own: the prompt's text copied into a grammar's free text, closed by the text
    # the grammar then forces (drafters/grammar_copy.py); silent without a grammar, like `grammar`
    SpecType("grammar-copy", 0.6, implemented=True, in_llama_cpp=False, joins_every_chain=True),
    SpecType("ngram-simple", 1, draft_max=DRAFT_MAX_NGRAM, native_flags=_NGRAM_SIMPLE_FLAGS, implemented=True),
    SpecType("ngram-map-k", 2, draft_max=DRAFT_MAX_NGRAM, native_flags=_NGRAM_MAP_K_FLAGS, implemented=True),
    SpecType("ngram-map-k4v", 3, draft_max=DRAFT_MAX_NGRAM, native_flags=_NGRAM_MAP_K4V_FLAGS, implemented=True),
    SpecType("ngram-mod", 4, draft_max=DRAFT_MAX_NGRAM, native_flags=_NGRAM_MOD_FLAGS, implemented=True),
    SpecType("ngram-cache", 5, draft_max=DRAFT_MAX_NGRAM, implemented=True),
    # llamaspec's own: the longest-match prompt lookup (drafters/prompt_lookup.py). After the
    # n-gram types, before the draft models, like them.
    SpecType("prompt-lookup", 5.5, aliases=("lookup",), draft_max=DRAFT_MAX_NGRAM, implemented=True,
             in_llama_cpp=False),
    # llamaspec's own: suffix decoding over this request and the earlier requests of the batch job,
    # server or chat (drafters/suffix.py); after prompt-lookup, so `suffix,prompt-lookup` copies
    # from the request's text first and the earlier requests fill in where it has no match.
    SpecType("suffix", 5.6, draft_max=DRAFT_MAX_NGRAM, implemented=True, in_llama_cpp=False),
    SpecType("draft-simple", 6, aliases=("draft",), needs_draft_model=True, draft_max=DRAFT_MAX_MODEL,
             native_flags=(("-md", "draft_path"), ("--spec-draft-n-max", "native_draft_max")), implemented=True),
    SpecType("draft-eagle3", 7, needs_draft_model=True, draft_max=DRAFT_MAX_MODEL, implemented=True),
    # draft-mtp: the target's own NextN heads, or (with --draft) a Gemma 4 assistant GGUF whose MTP
    # layers share the target's KV (drafters/assistant.py); the draft file is optional, so not needs_draft_model
    SpecType("draft-mtp", 8, aliases=("mtp",), loads_mtp_layers=True, draft_max=DRAFT_MAX_MODEL, implemented=True),
    SpecType("draft-dflash", 9, needs_draft_model=True, draft_max=DRAFT_MAX_MODEL, implemented=True),
    SpecType("draft-dspark", 10, needs_draft_model=True, draft_max=DRAFT_MAX_MODEL, implemented=True),
)}

#: the drafting types in llama.cpp's priority order, highest first
PRIORITY: tuple[str, ...] = tuple(t.name for t in sorted(SPEC_TYPES.values(), key=lambda t: t.priority)
                                   if t.name != "none")
#: names users type that llama.cpp does not accept, mapped to llama.cpp's names
ALIASES: dict[str, str] = {a: t.name for t in SPEC_TYPES.values() for a in t.aliases}
#: the type a draft model given with --draft enables when no chosen type uses one (draft-simple)
DRAFT_MODEL_TYPE: str = next(t.name for t in SPEC_TYPES.values() if t.implemented and t.needs_draft_model)


def canonical_name(name: str) -> str:
    """llama.cpp's spec-type name for `name` (aliases resolved, case and spaces ignored).

    >>> canonical_name(" MTP ")
    'draft-mtp'
    >>> canonical_name("ngram-mod")
    'ngram-mod'
    """
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in SPEC_TYPES:
        raise ValueError(f"unknown speculative type {name!r}; known: {', '.join(SPEC_TYPES)} "
                         f"(aliases: {', '.join(sorted(ALIASES))})")
    return key


def order_by_priority(names: Iterable[str]) -> list[str]:
    """Canonical names sorted in llama.cpp's priority order, duplicates and "none" dropped.

    >>> order_by_priority(["mtp", "ngram-mod", "ngram-simple", "ngram-mod"])
    ['ngram-simple', 'ngram-mod', 'draft-mtp']
    """
    seen = {canonical_name(n) for n in names}
    seen.discard("none")
    return [n for n in PRIORITY if n in seen]


def chain_joiners() -> list[str]:
    """The types that join every chain of drafting types (the grammar drafter), priority order."""
    return [n for n in PRIORITY if SPEC_TYPES[n].joins_every_chain]


def implemented_names() -> list[str]:
    """The types llamaspec implements, in the words `--spec-type` accepts."""
    return [t.name for t in SPEC_TYPES.values() if t.implemented]


def check_implemented(types: Iterable[str]) -> None:
    """UsageError for a type llama.cpp has and llamaspec does not implement yet."""
    missing = [t for t in types if not SPEC_TYPES[canonical_name(t)].implemented]
    if missing:
        raise UsageError(f"speculative type {missing[0]!r} is not implemented by llamaspec yet",
                         f"use one of: {', '.join(implemented_names())}")


def parse_spec_types(value: str | Sequence[str] | None) -> list[str]:
    """`--spec-type` value (comma list, llama.cpp names or aliases) -> canonical names in priority
    order. Unknown types and types llamaspec does not implement are usage errors."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else [v for s in value for v in s.split(",")]
    try:
        types = order_by_priority([i for i in items if i.strip()])
    except ValueError as e:
        raise UsageError(str(e), "e.g. --spec-type ngram-mod or --spec-type draft,ngram-simple") from None
    check_implemented(types)
    return types


def _types(types: str | Iterable[str]) -> list[SpecType]:
    """Table rows of a comma list or a list of names (aliases allowed)."""
    names = types.split(",") if isinstance(types, str) else types
    return [SPEC_TYPES[canonical_name(n)] for n in names if n.strip()]


def needs_draft_model(types: str | Iterable[str]) -> bool:
    """Does any of `types` (a list or a comma list) need a separate draft model?"""
    return any(t.needs_draft_model for t in _types(types))


def loads_mtp_layers(types: str | Iterable[str]) -> bool:
    """Does any of `types` need the target loaded with its MTP layers?"""
    return any(t.loads_mtp_layers for t in _types(types))


def default_draft_max(types: str | Iterable[str]) -> int:
    """Draft length cap when the user gives none: the smallest of the types' defaults (a chain
    with a draft model is capped like the draft model)."""
    return min((t.draft_max for t in _types(types) if t.draft_max is not None), default=DRAFT_MAX_NGRAM)


def default_bench_modes(with_draft_model: bool) -> list[str]:
    """What `bench` measures when no --spec-type is given: every implemented type that drafts, in
    priority order, except MTP (few models have the layers) and the draft-model ones other than
    draft-simple (EAGLE-3 / DFlash drafts are made for them: name them with --spec-type); with
    --draft, draft-simple."""
    return [t.name for t in SPEC_TYPES.values()
            if t.implemented and t.draft_max is not None and not t.loads_mtp_layers
            and (not t.needs_draft_model or (with_draft_model and t.name == DRAFT_MODEL_TYPE))]


def native_flags(types: str | Iterable[str], values: Mapping[str, object]) -> list[str]:
    """llama.cpp command-line flags for `types`, each with its value from `values` by key."""
    out: list[str] = []
    for t in _types(types):
        for flag, key in t.native_flags:
            out += [flag, str(values[key])]
    return out


def spec_type_help() -> str:
    """`--spec-type` names for help text: the implemented ones and their aliases."""
    names = [f"{t.name} ({'/'.join(t.aliases)})" if t.aliases else t.name
             for t in SPEC_TYPES.values() if t.implemented]
    return ", ".join(names)


@dataclass
class NgramParams:
    """n-gram drafter settings, llama.cpp's --spec-ngram-* flags.

    llamaspec's defaults are shorter than llama.cpp's (ngram-simple size-n 12, ngram-mod n-match 24
    / n-min 48): the adaptive draft length bounds what a wrong draft costs, so drafting can start
    after a shorter match. Measured on SmolLM2 F16, code-rewrite prompt, 256 tokens, 3 reps:
    ngram-simple 1.51x at size-n 12 -> 1.92x at 6; ngram-mod 1.33x at 24/48 -> 1.75x at 6/4,
    tokens identical to plain decoding in every run.
    """

    simple_size_n: int = 6      # llama.cpp: 12
    simple_size_m: int = 48
    mod_n_match: int = 6        # llama.cpp: 24
    mod_n_min: int = 4          # llama.cpp: 48
    mod_n_max: int = 64
    # prompt-lookup (llamaspec's own): match lengths looked for, and the longest draft copied
    lookup_n_min: int = 2
    lookup_n_max: int = 16
    # ngram-map-k / k4v: llama.cpp's defaults and meaning (llama.cpp ignores min-hits for ngram-map-k)
    map_k_size_n: int = 12
    map_k_size_m: int = 48
    map_k_min_hits: int = 1
    map_k4v_size_n: int = 12
    map_k4v_size_m: int = 48
    map_k4v_min_hits: int = 1
    # ngram-cache: llama.cpp's --lookup-cache-static (read only) / --lookup-cache-dynamic (read if
    # it exists, written back with this run's n-grams when the pipeline closes)
    cache_static: Path | None = None
    cache_dynamic: Path | None = None


@dataclass
class SpecOptions:
    spec_types: list[str] = field(default_factory=list)   # llama.cpp names, priority-ordered
    draft_path: Path | None = None
    draft_max: int | None = None
    draft_min: int = 0
    draft_p_min: float = 0.0
    adaptive: bool = True
    n_ctx: int | None = None   # None: 4096, or the model's training context if smaller; 0: training context
    n_threads: int | None = None
    n_gpu_layers: int | None = None        # None: auto, what fits (runtime/offload.py); -1: all
    n_gpu_layers_draft: int | None = None
    ngram: NgramParams = field(default_factory=NgramParams)
    amx: bool | None = None    # --amx / --no-amx; None: LLAMASPEC_AMX or the default (cpu_policy.py)
    n_seq: int = 1             # sequences decoded together (batch --parallel); n_ctx is per sequence
    # draft-simple with a draft of another vocabulary (drafters/translated.py): None decides from
    # the loaded vocabularies (llama.cpp's rules); --spec-replace TARGET DRAFT pairs
    translated: bool | None = None
    spec_replace: tuple[tuple[str, str], ...] = ()
    # draft-simple's model may load beside the first steps (drafters/lazy.py decides: a GPU
    # target, or a core the target's threads leave free), as for a draft the default chose
    # (api/generator.py); False: before them, so that a draft file the user named is refused at
    # once if llama.cpp cannot load it
    lazy_draft: bool = False
