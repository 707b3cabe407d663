"""The flags several commands take, each declared once with its range check.

A command names a shared flag by its type (`draft_p_min: DraftPMinOpt = 0.0`). Range checks are
typer callbacks built by `at_least` / `in_range` / `knob_option` (the sampling and drafting
settings, from the knob table: llamaspec/knobs.py), so they run while the flags are
parsed (before any model is resolved or downloaded) and fail as a `UsageError`: the same one line
and exit code 2 as every other flag error. Checks that relate two flags stay with the command.

Flags that together make one value are flag groups, added by a decorator in place of a
keyword-only parameter of the command:

    @app.command()
    @output_flags                      # --json, -q, -v  -> out: Output (configured)
    @ngram_flags                       # --spec-ngram-*  -> ngram: NgramParams (checked)
    def run(model: ..., *, ngram: NgramParams, out: Output) -> None: ...

Nothing here imports llama_cpp: `llamaspec --help` stays fast.
"""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from llamaspec import knobs
from llamaspec.cli import _output as output
from llamaspec.errors import InputError, UsageError
from llamaspec.errors import must_be
from llamaspec.runtime.cpu import AMX_HELP
from llamaspec.speculative.options import NgramParams  # (no llama_cpp import)


# ---- range checks (typer callbacks; None means the flag was not given) ----------------------------


def at_least(flag: str, minimum: int, hint: str | None = None) -> Callable[[Any], Any]:
    def check(value):
        if value is not None and value < minimum:
            raise UsageError(must_be(flag, minimum), hint)
        return value

    return check


def in_range(flag: str, low: int, high: int, *, open_low: bool = False) -> Callable[[Any], Any]:
    """[low, high], or (low, high] with open_low."""

    def check(value):
        if value is not None and not (low < value <= high if open_low else low <= value <= high):
            raise UsageError(must_be(flag, low, high, open_low=open_low))
        return value

    return check


def check_draft_length(value: int | None, flag: str) -> None:
    """A draft length of an n-gram flag must fit one verify batch (knobs.MAX_DRAFT: llama.cpp's
    n_batch, 512, with the last token), worded as the knob table's draft lengths."""
    if value is not None and value > knobs.MAX_DRAFT:
        raise UsageError(must_be(flag, 1, knobs.MAX_DRAFT, got=value), knobs.DRAFT_HINT)


def knob_option(name: str, *, low: int | None = None) -> Any:
    """The option of a knob of the table (llamaspec/knobs.py): its flags and help, and the table's
    one check as its callback (a UsageError naming the flag). Its default is `knobs.KNOBS[name].cli`.
    low: this command's own lower bound (bench's --draft-max 1: every measured mode drafts)."""
    k = knobs.KNOBS[name]

    def check(value):
        # the text as a JSON number would be (-1 an integer, 0.5 a float, "hot" a string), so the
        # table's check gives the words a request body gets: "--temp must be a number, got string"
        value = knobs.check(name, _number(value), k.spelled, low=low)
        return float(value) if value is not None and k.kind is float else value

    return Annotated[Optional[str], typer.Option(*k.flags, help=k.help, callback=check, metavar=f"<{k.kind.__name__}>")]


def _number(text: Any) -> Any:
    """A flag's text as the number it spells (int before float), else the text itself."""
    if not isinstance(text, str):
        return text
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# ---- shared flags --------------------------------------------------------------------------------

PromptOpt = Annotated[Optional[str], typer.Option("-p", "--prompt", help="Prompt text.")]
FileOpt = Annotated[Optional[Path], typer.Option("-f", "--file", help="Read the prompt from a file.")]
ThreadsOpt = Annotated[Optional[int], typer.Option(
    "-t", "--threads", help="CPU threads (default: all).",
    callback=at_least("-t/--threads", 0, "0 (run, batch) uses every core"))]
ChatOpt = Annotated[Optional[bool], typer.Option(
    "--chat/--raw", help="Apply the model's chat template (default when it has one) or send raw text.")]
AmxOpt = Annotated[Optional[bool], typer.Option("--amx/--no-amx", help=AMX_HELP)]
OfflineOpt = Annotated[bool, typer.Option(
    "--offline", help="Never use the network (local files and cache only).")]
ForceDraftOpt = Annotated[bool, typer.Option(
    "--force-draft", help="Use a draft that fails the vocabulary check.")]
FixedDraftOpt = Annotated[bool, typer.Option(
    "--fixed-draft", help="Always draft --draft-max tokens (no adaptive draft length).")]
DraftPMinOpt = knob_option("draft_p_min")
DraftMaxOpt = knob_option("draft_max")                  # run: 0 drafts nothing
DraftMaxMeasuredOpt = knob_option("draft_max", low=1)   # bench: every measured mode drafts

CTX_SIZE_CHECK = at_least("-c/--ctx-size", 0, "0 uses the model's training context")


def check_draft_exists(draft: str | None, flag: str = "--draft", *, number_is_length: bool = False) -> None:
    """A --draft that names a local file which is not there: one line before any model loads.
    number_is_length: run and batch read llama.cpp's old `--draft N` as --draft-max N."""
    if draft is None or draft.lower() in ("auto", "none") or (number_is_length and draft.isdigit()):
        return
    from llamaspec import hub
    from llamaspec.errors import ModelFileError

    where = hub.classify(draft)
    if isinstance(where, Path) and not where.exists():
        raise ModelFileError(f"draft model file not found: {draft}",
                             f"check the {flag} path, or give a Hub reference org/repo:QUANT")


def _weights_size(path: Path) -> int:
    """Bytes of a GGUF, all parts of a split one (name-00001-of-00003.gguf)."""
    import re

    m = re.fullmatch(r"(.*)-\d{5}-of-(\d{5})\.gguf", path.name)
    parts = [path.with_name(f"{m[1]}-{i:05d}-of-{m[2]}.gguf") for i in range(1, int(m[2]) + 1)] if m else [path]
    return sum(p.stat().st_size for p in parts if p.is_file())


def draft_size_warning(target: Path | None, draft: Path | None) -> str | None:
    """One line when the draft is bigger than its target: every step then costs more than plain
    decoding would (the pair still runs, token for token the same)."""
    if target is None or draft is None:
        return None
    try:
        t, d = _weights_size(Path(target)), _weights_size(Path(draft))
    except OSError:
        return None
    if d <= t:
        return None
    return (f"the draft {Path(draft).name} ({d / 2**20:,.1f} MiB) is bigger than the target {Path(target).name} "
            f"({t / 2**20:,.1f} MiB): speculation will likely be slower than plain decoding; swap them?")


def read_prompt_file(path: Path) -> str:
    """The text of a -f prompt file, with one-line errors for the ways it can be wrong."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"prompt file not found: {path}", "check the path given to -f") from None
    except IsADirectoryError:
        raise InputError(f"prompt file is a directory: {path}", "give -f a text file") from None
    except UnicodeDecodeError:
        raise InputError(f"prompt file is not UTF-8 text: {path}", "give a text file") from None


# ---- constrained output: llama.cpp's --grammar, --grammar-file, -j/--json-schema, -jf/--json-schema-file

IgnoreEosOpt = Annotated[bool, typer.Option(
    "--ignore-eos", help="Generate past end-of-generation (until -n or a full context), as llama.cpp's flag.")]
LogitBiasOpt = Annotated[Optional[list[str]], typer.Option(
    "-l", "--logit-bias", metavar="TOKEN_ID(+/-)BIAS",
    help="Add BIAS to a token's logit, as llama.cpp's flag: 15043+1, 15043-1, 15043-inf (bans it); "
         "-100..100, repeatable.")]


def logit_bias_flags(values: list[str] | None) -> dict | None:
    """-l/--logit-bias values (llama.cpp's TOKEN_ID(+/-)BIAS) -> {token id: bias}, checked by the
    one parser (openai/requests.py: a request's logit_bias, the same words), or None.

        >>> logit_bias_flags(["15043+1", "7-inf", "3-2.5"])
        {15043: 1.0, 7: -inf, 3: -2.5}
    """
    if not values:
        return None
    import re

    from llamaspec.openai.requests import check_fields

    bias = {}
    for v in values:
        m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\S+)\s*", v)
        if m is None:
            raise UsageError(f"-l/--logit-bias takes TOKEN_ID(+/-)BIAS, not {v!r}",
                             "e.g. -l 15043+1, or -l 15043-inf to ban the token", field="logit_bias")
        n = _number(m[3]) if m[3] != "inf" else float("inf")
        bias[m[1]] = -n if m[2] == "-" and not isinstance(n, str) else n
    return check_fields({"logit_bias": bias})["logit_bias"]


GrammarOpt = Annotated[Optional[str], typer.Option(
    "--grammar", metavar="GBNF", help="Constrain the output to a GBNF grammar (llama.cpp's format), "
    "e.g. 'root ::= \"yes\" | \"no\"'.")]
GrammarFileOpt = Annotated[Optional[Path], typer.Option(
    "--grammar-file", metavar="FILE", help="Read the GBNF grammar from FILE.")]
JsonSchemaOpt = Annotated[Optional[str], typer.Option(
    "-j", "--json-schema", metavar="SCHEMA", help="Constrain the output to JSON that matches this JSON schema "
    "('{}': any JSON value); enforced by llguidance, whitespace as llama.cpp's.")]
JsonSchemaFileOpt = Annotated[Optional[Path], typer.Option(
    "-jf", "--json-schema-file", metavar="FILE", help="Read the JSON schema from FILE.")]

GRAMMAR_FLAGS = {"grammar": "--grammar", "grammar_file": "--grammar-file", "json_schema": "-j/--json-schema",
                 "json_schema_file": "-jf/--json-schema-file"}


def _read_flag_file(path: Path, flag: str) -> str:
    """A --grammar-file / -jf file's text; one line naming the flag when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{flag}: file not found: {path}", f"check the path given to {flag}") from None
    except IsADirectoryError:
        raise UsageError(f"{flag}: {path} is a directory", f"give {flag} a file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag}: {path} is not UTF-8 text", f"give {flag} a text file") from None
    except OSError as e:
        raise UsageError(f"{flag}: cannot read {path}: {e.strerror or e}", "check the file's permissions") from None


def grammar_flags(grammar: str | None, grammar_file: Path | None, json_schema: str | None,
                  json_schema_file: Path | None):
    """The GrammarSpec of the one grammar flag given (None: none given), its `field` the flag, so
    an error later (llama.cpp refusing the grammar) names it too. Schemas are converted here,
    before any model loads; a GBNF grammar compiles when the model is loaded (it needs the vocabulary)."""
    given = {name: value for name, value in zip(GRAMMAR_FLAGS, (grammar, grammar_file, json_schema, json_schema_file))
             if value is not None}
    from llamaspec.openai.response_format import one_constraint

    one_constraint([GRAMMAR_FLAGS[n] for n in given])
    if not given:
        return None
    from llamaspec.runtime.grammar import GrammarSpec, grammar_from_schema

    (name, value), = given.items()
    flag = GRAMMAR_FLAGS[name]
    text = _read_flag_file(value, flag) if name.endswith("_file") else value
    gbnf = name.startswith("grammar")
    if not text.strip():
        raise UsageError(f"{flag} is empty", f"give {flag} " + ('a GBNF grammar, e.g. root ::= "yes" | "no"' if gbnf
                                                              else "a JSON schema, e.g. '{\"type\": \"object\"}'"))
    if gbnf:
        return GrammarSpec(text, field=flag)
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{flag} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                         "give a JSON schema object ('{}': any JSON value); quote it for the shell") from None
    return grammar_from_schema(schema, field=flag)


# ---- flag groups ---------------------------------------------------------------------------------


def flag_group(name: str, flags: dict[str, tuple[Any, Any]], build: Callable[..., Any]):
    """A decorator: the command's keyword-only parameter `name` becomes `flags` (parameter name
    -> (Annotated type, default)) at the same place in its --help, and the command is called with
    `name` = build(**the values of those flags)."""
    group = [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=t, default=d)
             for p, (t, d) in flags.items()]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(command)
        params = list(sig.parameters.values())
        at = [p.name for p in params].index(name)
        if params[at].kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(f"{command.__name__}: `{name}` must be keyword-only (after `*`)")
        # Typer needs the annotations as objects; `from __future__ import annotations` made them
        # strings, resolved here in the command's module. Keyword-only parameters are the flag
        # groups' places (this one or another decorator's): their annotations are never needed.
        params = [p.replace(annotation=eval(p.annotation, command.__globals__))
                  if isinstance(p.annotation, str) and p.kind is not p.KEYWORD_ONLY else p for p in params]
        params[at:at + 1] = group

        @functools.wraps(command)
        def with_group(**kwargs: Any) -> Any:
            kwargs[name] = build(**{p: kwargs.pop(p) for p in flags})
            return command(**kwargs)

        with_group.__signature__ = sig.replace(parameters=params, return_annotation=None)  # type: ignore[attr-defined]
        with_group.__annotations__ = {p.name: p.annotation for p in params}
        return with_group

    return decorate


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object to stdout instead of tables.")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Print only the essential result; no progress.")]
VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="More detail on stderr.")]

# Every command: how it prints. The command gets `out`, the configured printer.
output_flags = flag_group(
    "out", {"json": (JsonOpt, False), "quiet": (QuietOpt, False), "verbose": (VerboseOpt, False)},
    lambda json, quiet, verbose: output.configure(json=json, quiet=quiet, verbose=verbose))


# llama.cpp's n-gram drafter flags (run and bench); unset flags keep llamaspec's default (NgramParams).
NgramSizeNOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-simple-size-n", help="ngram-simple: n-gram length to match (llamaspec 6, llama.cpp 12).")]
NgramSizeMOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-simple-size-m", help="ngram-simple: tokens copied after a match (48).")]
NgramModMatchOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-mod-n-match", help="ngram-mod: n-gram length hashed (llamaspec 6, llama.cpp 24).")]
NgramModMinOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-mod-n-min", help="ngram-mod: shortest draft kept (llamaspec 4, llama.cpp 48).")]
NgramModMaxOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-mod-n-max", help="ngram-mod: longest draft (64).")]

NgramMapKSizeNOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-map-k-size-n", help="ngram-map-k: key n-gram length (12).")]
NgramMapKSizeMOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-map-k-size-m", help="ngram-map-k: tokens drafted after a key (48).")]
NgramMapKMinHitsOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-map-k-min-hits", help="ngram-map-k: accepted for llama.cpp parity, which ignores it (1).")]
NgramMapK4vSizeNOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-map-k4v-size-n", help="ngram-map-k4v: key n-gram length (12).")]
NgramMapK4vSizeMOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-map-k4v-size-m", help="ngram-map-k4v: tokens drafted after a key (48).")]
NgramMapK4vMinHitsOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-map-k4v-min-hits", help="ngram-map-k4v: lookups of a key before it drafts (1).")]

LookupNMinOpt = Annotated[Optional[int], typer.Option(
    "--spec-prompt-lookup-n-min", help="prompt-lookup (llamaspec's own): shortest match to draft after (2).")]
LookupNMaxOpt = Annotated[Optional[int], typer.Option(
    "--spec-prompt-lookup-n-max", help="prompt-lookup: match length counted up to this (16).")]

LookupCacheStaticOpt = Annotated[Optional[Path], typer.Option(
    "-lcs", "--lookup-cache-static", help="ngram-cache: n-gram cache file to draft from, read only "
    "(llama.cpp's format, e.g. made by llama-lookup-create).")]
LookupCacheDynamicOpt = Annotated[Optional[Path], typer.Option(
    "-lcd", "--lookup-cache-dynamic", help="ngram-cache: n-gram cache file read at start (if it exists) "
    "and written back with this run's n-grams at the end.")]


def check_cache_files(static: Path | None, dynamic: Path | None) -> None:
    """The --lookup-cache-* paths: the static file must exist; the dynamic one may be new, but its
    directory must exist (it is written at the end: better to fail before generating)."""
    if static is not None and not static.is_file():
        what = "is a directory" if static.is_dir() else "not found"
        raise UsageError(f"--lookup-cache-static file {what}: {static}",
                         "give an n-gram cache file in llama.cpp's format (llama-lookup-create writes one)")
    if dynamic is not None:
        if dynamic.is_dir():
            raise UsageError(f"--lookup-cache-dynamic is a directory: {dynamic}", "give a file path")
        if not dynamic.parent.is_dir():
            raise UsageError(f"--lookup-cache-dynamic: directory {dynamic.parent} does not exist",
                             "create it, or give a path in an existing directory")


def ngram_params(size_n: int | None, size_m: int | None, mod_match: int | None, mod_min: int | None,
                 mod_max: int | None, map_k_size_n: int | None = None, map_k_size_m: int | None = None,
                 map_k_min_hits: int | None = None, map_k4v_size_n: int | None = None,
                 map_k4v_size_m: int | None = None, map_k4v_min_hits: int | None = None,
                 cache_static: Path | None = None, cache_dynamic: Path | None = None,
                 lookup_n_min: int | None = None, lookup_n_max: int | None = None) -> NgramParams:
    """NgramParams from the --spec-ngram-* and --lookup-cache-* flags, checked; unset flags keep
    the defaults."""
    check_cache_files(cache_static, cache_dynamic)
    given = {"simple_size_n": size_n, "simple_size_m": size_m, "mod_n_match": mod_match,
             "mod_n_min": mod_min, "mod_n_max": mod_max, "map_k_size_n": map_k_size_n,
             "map_k_size_m": map_k_size_m, "map_k_min_hits": map_k_min_hits, "map_k4v_size_n": map_k4v_size_n,
             "map_k4v_size_m": map_k4v_size_m, "map_k4v_min_hits": map_k4v_min_hits,
             "lookup_n_min": lookup_n_min, "lookup_n_max": lookup_n_max}
    for name, value in given.items():
        flag = (f"--spec-prompt-{name}" if name.startswith("lookup_") else f"--spec-ngram-{name}").replace("_", "-")
        at_least(flag, 1)(value)
    for name in ("simple_size_m", "mod_n_max", "map_k_size_m", "map_k4v_size_m"):  # draft lengths: one verify batch
        check_draft_length(given[name], f"--spec-ngram-{name.replace('_', '-')}")
    params = replace(NgramParams(), **{k: v for k, v in given.items() if v is not None},
                     cache_static=cache_static, cache_dynamic=cache_dynamic)
    if params.mod_n_min > params.mod_n_max:
        raise UsageError("--spec-ngram-mod-n-min must not exceed --spec-ngram-mod-n-max")
    if params.lookup_n_min > params.lookup_n_max:
        raise UsageError("--spec-prompt-lookup-n-min must not exceed --spec-prompt-lookup-n-max")
    return params


# run and bench: the command gets `ngram`, checked NgramParams.
ngram_flags = flag_group(
    "ngram", {"ngram_size_n": (NgramSizeNOpt, None), "ngram_size_m": (NgramSizeMOpt, None),
              "ngram_mod_match": (NgramModMatchOpt, None), "ngram_mod_min": (NgramModMinOpt, None),
              "ngram_mod_max": (NgramModMaxOpt, None), "map_k_size_n": (NgramMapKSizeNOpt, None),
              "map_k_size_m": (NgramMapKSizeMOpt, None), "map_k_min_hits": (NgramMapKMinHitsOpt, None),
              "map_k4v_size_n": (NgramMapK4vSizeNOpt, None), "map_k4v_size_m": (NgramMapK4vSizeMOpt, None),
              "map_k4v_min_hits": (NgramMapK4vMinHitsOpt, None),
              "lookup_cache_static": (LookupCacheStaticOpt, None),
              "lookup_cache_dynamic": (LookupCacheDynamicOpt, None),
              "lookup_n_min": (LookupNMinOpt, None), "lookup_n_max": (LookupNMaxOpt, None)},
    lambda **flags: ngram_params(*flags.values()))  # (the values come in the order declared above)
