"""The options of a generation, shared by `run`, `chat`, `batch` and `serve` (declared once): the
command gets them as `gen`, one `GenerationOptions` (llamaspec/api/options.py) for
`Generator.from_options`; --grammar / -j and their file forms become its `grammar`. The sampling
and drafting options, their defaults and checks are the knob table's (llamaspec/knobs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from llamaspec import knobs
from llamaspec.cli._options import (
    CTX_SIZE_CHECK, AmxOpt, ChatOpt, FixedDraftOpt, ForceDraftOpt, GrammarFileOpt, GrammarOpt, IgnoreEosOpt,
    JsonSchemaFileOpt, JsonSchemaOpt, LogitBiasOpt, OfflineOpt, ThreadsOpt, check_draft_exists, flag_group,
    grammar_flags, knob_option, logit_bias_flags,
)
from llamaspec.errors import UsageError
from llamaspec.speculative.options import spec_type_help  # the spec-type table; no llama_cpp import

if TYPE_CHECKING:
    from llamaspec.api.options import GenerationOptions


SPEC_HELP = (f"Speculative types, comma list, llama.cpp's names (aliases): {spec_type_help()}. "
             "Default: draft when --draft is given, else what --draft auto finds on disk "
             "(never a download); none turns speculation off.")

DraftOpt = Annotated[Optional[str], typer.Option(
    "--draft", "-md", "--model-draft",
    help="Draft model: a GGUF path or Hub ref, 'auto' (MTP heads, a draft on disk, the registry, "
         "else prompt-lookup), or 'none'. Default (no --draft, no --spec-type): auto without downloads.")]
SpecTypeOpt = Annotated[Optional[str], typer.Option("--spec-type", help=SPEC_HELP)]
StopOpt = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")]
CtxSizeOpt = Annotated[Optional[int], typer.Option(
    "-c", "--ctx-size", help="Context size in tokens (default 4096, capped at the model's training "
                             "context; 0: the training context).", callback=CTX_SIZE_CHECK)]


def _gpu_layers(flag: str):
    """N, -1 or 'all' (every layer), 'auto' (None: what fits, decided at load by runtime/offload.py)."""
    def parse(value: str | None) -> int | None:
        if value is None or value.strip().lower() == "auto":
            return None
        if value.strip().lower() == "all":
            return -1
        try:
            n = int(value)
        except ValueError:
            raise UsageError(f"{flag} takes a number of layers, 'auto' or 'all', not {value!r}") from None
        if n < -1:
            raise UsageError(f"{flag} must be >= -1", "-1 (or 'all') means every layer")
        return n

    return parse


NglOpt = Annotated[Optional[str], typer.Option(
    "-ngl", "--n-gpu-layers", "--gpu-layers", metavar="N|auto|all", callback=_gpu_layers("-ngl"),
    help="Target layers on the GPU; -1 or all: every layer. Default auto: as many as fit in device memory "
         "beside the draft (llama.cpp's fit; 0 on CPU-only builds).")]
NgldOpt = Annotated[Optional[str], typer.Option(
    "-ngld", "--n-gpu-layers-draft", "--gpu-layers-draft", "--spec-draft-ngl", metavar="N|auto|all",
    callback=_gpu_layers("-ngld"),
    help="Draft layers on the GPU; -1 or all: every layer. Default auto: all if they fit.")]
SystemOpt = Annotated[Optional[str], typer.Option("--system", help="System message (chat mode).")]
TargetArg = Annotated[Optional[str], typer.Argument(
    help="Target GGUF: a path or Hub reference (org/repo:QUANT). Default: the bundled SmolLM2.")]
ColorOpt = Annotated[bool, typer.Option("--color", help="Show accepted draft tokens in colour.")]
PAIR_SEP = "\x1f"   # main() joins `--spec-replace TARGET DRAFT` into one value (typer has no 2-value lists)
SpecReplaceOpt = Annotated[Optional[list[str]], typer.Option(
    "--spec-replace", metavar="TARGET DRAFT",
    help="Translated drafting (a draft of another vocabulary): replace TARGET in the text the draft sees "
         "with DRAFT, and back in its drafts (chat template tags). Repeatable; as llama.cpp's flag.")]
SearchOpt = Annotated[Optional[list[Path]], typer.Option("--search", help="Also look here for drafts (--draft auto).")]


def _generation_options(**v: Any) -> "GenerationOptions":
    from llamaspec.api.options import GenerationOptions
    from llamaspec.speculative.sampling_params import SamplingParams

    check_draft_exists(v["draft"], number_is_length=True)
    knobs.check_draft_min(v["draft_min"], v["draft_max"], flags=True)   # (named by their flags, before any load)
    spec_replace = []
    for value in v["spec_replace"] or ():
        target, sep, draft = value.partition(PAIR_SEP)
        if not sep or not target:
            raise UsageError("--spec-replace takes two values", "--spec-replace TARGET DRAFT, e.g. "
                             "--spec-replace '<start_of_turn>' '<|im_start|>'")
        spec_replace.append((target, draft))
    sampling = SamplingParams(**{name: v[name] for name in knobs.SAMPLING})
    return GenerationOptions(
        draft=v["draft"], spec_type=v["spec_type"], draft_max=v["draft_max"], draft_min=v["draft_min"],
        draft_p_min=v["draft_p_min"], adaptive=not v["fixed_k"], force_draft=v["force_draft"],
        search=tuple(v["search"] or ()), offline=v["offline"], ctx_size=v["ctx_size"], threads=v["threads"],
        n_gpu_layers=v["ngl"], n_gpu_layers_draft=v["ngld"], amx=v["amx"], sampling=sampling,
        max_tokens=v["max_tokens"], stop=tuple(v["stop"] or ()), chat=v["chat"], system=v["system"],
        spec_replace=tuple(spec_replace), ignore_eos=v["ignore_eos"], logit_bias=logit_bias_flags(v["logit_bias"]),
        grammar=grammar_flags(v["grammar"], v["grammar_file"], v["json_schema"], v["json_schema_file"]))


# run and batch: the command gets `gen`, a GenerationOptions (the model, ngram and parallel apart).
def _knobs(*names: str) -> dict[str, tuple[Any, Any]]:
    """The flag group's entries of these knobs: (option, the command line's default), from the table."""
    return {name: (knob_option(name), knobs.KNOBS[name].cli) for name in names}


generation_flags = flag_group("gen", {
    "draft": (DraftOpt, None), "spec_type": (SpecTypeOpt, None), **_knobs(*knobs.DRAFTING),
    "fixed_k": (FixedDraftOpt, False), **_knobs("max_tokens", *knobs.SAMPLING),
    "stop": (StopOpt, None), "ignore_eos": (IgnoreEosOpt, False), "logit_bias": (LogitBiasOpt, None),
    "ctx_size": (CtxSizeOpt, None), "threads": (ThreadsOpt, None),
    "ngl": (NglOpt, None), "ngld": (NgldOpt, None), "amx": (AmxOpt, None), "chat": (ChatOpt, None),
    "system": (SystemOpt, None), "offline": (OfflineOpt, False), "force_draft": (ForceDraftOpt, False),
    "search": (SearchOpt, None), "spec_replace": (SpecReplaceOpt, None),
    "grammar": (GrammarOpt, None), "grammar_file": (GrammarFileOpt, None), "json_schema": (JsonSchemaOpt, None),
    "json_schema_file": (JsonSchemaFileOpt, None),
}, _generation_options)


def join_pairs(args: list[str]) -> list[str]:
    r"""`--spec-replace A B` -> `--spec-replace A<sep>B`, so the parser sees one value per flag.

        >>> join_pairs(["run", "--spec-replace", "<a>", "<b>", "-n", "4"])
        ['run', '--spec-replace', '<a>\x1f<b>', '-n', '4']
    """
    out, i = [], 0
    while i < len(args):
        if args[i] == "--":
            return out + args[i:]
        if args[i] == "--spec-replace" and len(args[i + 1:i + 3]) == 2:
            out += [args[i], PAIR_SEP.join(args[i + 1:i + 3])]
            i += 3
            continue
        out.append(args[i])
        i += 1
    return out
