"""Outputs that match the schema, always (issue 34): every schema of the conformance corpus
(schema_corpus.py) generated from on SmolLM2 through the public `Generator`, built as `run` builds
it, with the default speculation and with spec type none, greedy (the two texts identical), and at
temperature 1 with 3 seeds; every output validated by jsonschema's Draft 2020-12 validator and its
FormatChecker. A refusal of a listed keyword, an invalid output and finish_reason "length" are
failures. Keywords outside the list must be enforced or refused by name, never dropped.

Each run writes its failures to /tmp/conformance (failures.json: schema, mode, output, error;
summary.txt: one line per failure; results.json: every output) for whoever fixes the engine.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import best_match

from llamaspec.api.generator import Generator, Request
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.grammar_errors import GrammarError
from schema_corpus import EXAMPLES, OUTSIDE, Case, corpus, keywords, with_room

pytestmark = [pytest.mark.real, pytest.mark.slow]

# ---- formats: jsonschema checks date-time, time, duration and hostname only with extra packages
# (rfc3339-validator, isoduration, fqdn); without them a format passes unchecked. Ours, strict:
_DATE = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
_TIME = r"([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9]|60)(\.[0-9]+)?([zZ]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_DUR_T = r"T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)"
_DURATION = rf"P(([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)({_DUR_T})?|{_DUR_T}|[0-9]+W)"
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _date_ok(s: str) -> bool:
    m = re.fullmatch(_DATE, s)
    try:
        return bool(m) and bool(datetime.date(*map(int, m.groups())))
    except ValueError:
        return False


def format_checker() -> FormatChecker:
    """Draft 2020-12's checkers (a bare FormatChecker() has draft 3's `time`: no time zone), plus ours."""
    fc = FormatChecker(())
    fc.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
    extra = {
        "date-time": lambda s: (m := re.fullmatch(rf"({_DATE})[Tt]({_TIME})", s)) is not None and _date_ok(m.group(1)),
        "time": lambda s: re.fullmatch(_TIME, s) is not None,
        "duration": lambda s: re.fullmatch(_DURATION, s) is not None,
        "hostname": lambda s: 0 < len(s) <= 253 and all(_LABEL.fullmatch(x) for x in s.split(".")),
    }
    for name, ok in extra.items():
        if name not in fc.checkers:
            fc.checks(name)(lambda s, ok=ok: not isinstance(s, str) or ok(s))
    return fc


FORMAT_SAMPLES = {   # format: (a valid value, an invalid one): the checker must tell them apart
    "date": ("2024-02-29", "2023-02-29"), "time": ("09:30:00Z", "09:30"), "date-time": ("2024-01-01T09:30:00+01:00",
                                                                                    "2024-01-01 09:30"),
    "uuid": ("123e4567-e89b-12d3-a456-426614174000", "123e4567"), "email": ("a@b.com", "ab.com"),
    "hostname": ("example.com", "-bad-.com"), "ipv4": ("192.168.0.1", "256.1.1.1"), "ipv6": ("::1", "1:::2"),
    "duration": ("PT1H30M", "1H30M"),
}


CASES = corpus()
OUTSIDE_CASES = [with_room(Case(f"outside-{name}", schema, f"Give {ask} as JSON. Reply with JSON only.", 120))
                 for name, _, schema, ask in OUTSIDE]
SEEDS = (1, 2, 3)
# (mode, request fields): greedy twice (which generator: the mode says), then temperature 1, 3 seeds
MODES = ([("greedy/default", {"temperature": 0.0}), ("greedy/none", {"temperature": 0.0})]
         + [(f"T1/seed{s}", {"temperature": 1.0, "seed": s}) for s in SEEDS])
KEYWORD = {f"outside-{name}": keyword for name, keyword, _, _ in OUTSIDE}   # what a refusal must name
PARALLEL = 8         # sequences decoded together: the API's many-requests path (generate_many)
CTX = 1024           # context per sequence
# Greedy with and without speculation: the same text, or parted where the target's logits of the two
# tokens chosen are within float noise (batch shapes round differently; F16 parted at gaps of
# 0.000-0.005 here): the bound the suite uses for F16 (test_parallel.py, engine_helpers.assert_lossless)
NEAR_TIE = 0.1
REPORT = Path("/tmp/conformance")
REPO = Path(__file__).resolve().parents[1]

# What the corpus must cover, with at least this many schemas each (the list: OpenAI strict
# mode's keywords and llama-server's).
COVERAGE = {k: 3 for k in (
    "type", "type list", "enum", "enum with null", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "properties", "items", "prefixItems", "required", "additionalProperties",
    "additionalProperties: schema", "pattern", "minLength", "maxLength", "minItems", "maxItems",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "title", "description",
    *(f"format: {f}" for f in FORMAT_SAMPLES))} | {"recursive": 5, "same-named $defs": 4}
for _r in ("all", "some", "none"):
    COVERAGE[f"required {_r}"] = 3
for _e in ("closed", "open", "typed"):
    COVERAGE[f"additionalProperties {_e}"] = 3


@dataclass
class Outcome:
    mode: str
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish: str = ""
    error: str | None = None     # the refusal (a GrammarError's message), if the request was refused
    refused_by: type | None = None


@dataclass
class Conformance:
    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)   # case id -> its outcomes
    failures: dict[str, list[dict]] = field(default_factory=dict)      # case id -> its failures
    # not failures: outputs that repeat a key (valid as jsonschema reads them: the last one wins),
    # greedy texts that part at a near tie
    notes: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def _generate(gens: dict[str, Generator], cases: list[Case]) -> dict[str, list[Outcome]]:
    """Every case in every mode, each mode's requests in one generate_many."""
    out: dict[str, list[Outcome]] = {c.id: [] for c in cases}
    by_id = {c.id: c for c in cases}
    for mode, fields in MODES:
        gen = gens["none" if mode == "greedy/none" else "default"]
        reqs = [Request(c.prompt, id=c.id, json_schema=c.schema, max_tokens=c.max_tokens, **fields) for c in cases]
        for r in gen.generate_many(reqs):
            assert r.id in by_id, r.id
            out[r.id].append(Outcome(mode, r.text, r.tokens, r.finish_reason,
                                     None if r.error is None else r.error.message,
                                     None if r.error is None else type(r.error)))
    return out


def _divergence(gen: Generator, case: Case, a: list[int], b: list[int]) -> tuple[str, float]:
    """Where two greedy token lists part, and the target's logit gap there between the two tokens
    chosen (the end-of-generation token for one that ended): both were allowed by the grammar, so
    greedy decoding picks the higher; a gap near zero is float noise between batch shapes, a wide
    one means a run did not take the masked argmax."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    target = gen.pipeline.target
    ta, tb = (t[i] if i < len(t) else target.eos for t in (a, b))
    ctx = Context(target, ContextConfig(n_ctx=2048))
    try:
        row = ctx.logits(ctx.decode(gen.tokenize(case.prompt) + a[:i], 0, 0, "last"))[0]
    finally:
        ctx.close()
    gap = float(abs(row[ta] - row[tb]))
    return (f"parted at token {i}: default chose {target.detokenize([ta])!r} (logit {row[ta]:.3f}), none chose "
            f"{target.detokenize([tb])!r} (logit {row[tb]:.3f}); gap {gap:.4f}"), gap


def _pairs(seen: list):
    """json.loads' object_pairs_hook: notes repeated keys (an open map's grammar cannot forbid them)."""
    def hook(pairs):
        keys = [k for k, _ in pairs]
        seen.extend(sorted({k for k in keys if keys.count(k) > 1}))
        return dict(pairs)
    return hook


def _check(case: Case, outcomes: list[Outcome], checker, diagnose, notes: list[dict]) -> list[dict]:
    """The failures of one case: refusals, unfinished or invalid outputs, greedy texts that differ
    (past a near tie). `notes` gets what is not a failure: repeated keys, near-tie flips."""
    validator = Draft202012Validator(case.schema, format_checker=checker)
    fails = []

    def fail(o: Outcome, kind: str, why: str) -> None:
        fails.append({"case": case.id, "mode": o.mode, "kind": kind, "error": why, "output": o.text,
                      "finish_reason": o.finish, "schema": case.schema, "prompt": case.prompt})

    named = KEYWORD.get(case.id)   # outside the list: a refusal naming it is the right answer
    for o in outcomes:
        if o.error is not None:
            if named is None or named not in o.error or not issubclass(o.refused_by, GrammarError):
                fail(o, "refused", o.error)
            continue
        if o.finish != "stop":
            fail(o, "unfinished", f"finish_reason {o.finish!r} (max_tokens {case.max_tokens})")
            continue
        repeated: list[str] = []
        try:
            value = json.loads(o.text, object_pairs_hook=_pairs(repeated))
        except json.JSONDecodeError as e:
            fail(o, "not JSON", str(e))
            continue
        if repeated:
            notes.append({"case": case.id, "mode": o.mode, "note": f"repeats key(s) {repeated}", "output": o.text})
        err = best_match(validator.iter_errors(value))
        if err is not None:
            fail(o, "invalid", f"{err.message} (at {'/'.join(map(str, err.absolute_path)) or 'root'})")
    greedy = {o.mode: o for o in outcomes if o.mode.startswith("greedy/")}
    if len(greedy) == 2 and all(o.error is None for o in greedy.values()):
        a, b = greedy["greedy/default"], greedy["greedy/none"]
        if a.text != b.text:
            where, gap = diagnose(case, a.tokens, b.tokens)
            if gap < NEAR_TIE:
                notes.append({"case": case.id, "mode": "greedy", "note": f"near-tie flip, {where}", "output": a.text})
            else:
                fail(a, "greedy differs", f"default speculation and spec type none differ ({where}): none wrote {b.text!r}")
    return fails


def _head() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True,
                              text=True, timeout=10).stdout.strip()[:100]
    except (OSError, subprocess.SubprocessError):
        return "?"


def _write_report(res: Conformance, cases: list[Case], head: tuple[str, str]) -> None:
    REPORT.mkdir(parents=True, exist_ok=True)
    fails = [f for fs in res.failures.values() for f in fs]
    (REPORT / "failures.json").write_text(json.dumps(fails, indent=1, ensure_ascii=False))
    (REPORT / "notes.json").write_text(json.dumps(res.notes, indent=1, ensure_ascii=False))
    (REPORT / "results.json").write_text(json.dumps(
        {c.id: {"schema": c.schema, "prompt": c.prompt, "outputs": {o.mode: {"text": o.text, "finish": o.finish,
                                                                             "error": o.error, "tokens": o.tokens}
                                                                    for o in res.outcomes.get(c.id, ())}}
         for c in cases}, indent=1, ensure_ascii=False))
    n = sum(len(v) for v in res.outcomes.values())
    lines = [f"# {len(cases)} schemas, {n} outputs, {len(fails)} failures, {res.seconds:.0f} s; "
             f"HEAD at start: {head[0]}" + ("" if head[0] == head[1] else f"; at end: {head[1]} (re-run)")]
    lines += [f"{f['case']} [{f['mode']}] {f['kind']}: {f['error'][:200]!r} output={f['output'][:120]!r}"
              for f in fails]
    lines += [f"(not a failure) {n['case']} [{n['mode']}] {n['note']}" for n in res.notes]
    (REPORT / "summary.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def conformance(request, smollm2_f16) -> Conformance:
    """Generate every selected case (the whole corpus in a full run) once for the module."""
    wanted = {item.callspec.params["case"].id for item in request.session.items
              if hasattr(item, "callspec") and isinstance(item.callspec.params.get("case"), Case)}
    cases = [c for c in CASES + OUTSIDE_CASES if c.id in wanted]
    res, head = Conformance(), _head()
    if not cases:
        return res
    start = time.monotonic()
    # `run`'s defaults (draft auto without downloads, its sampling), the temperature per request; one
    # generator per speculation, both loaded once for the module.
    # F16: its greedy texts do not part between batch shapes where Q4_1's do (16 of 80 schemas, at
    # logit gaps of 0.01-0.3); it is faster here too.
    # (ctx_size: a sequence needs ~400 tokens; run's 4096 each would hold 1.5 GB of KV for nothing)
    with Generator(smollm2_f16, parallel=PARALLEL, ctx_size=CTX) as spec, \
            Generator(smollm2_f16, spec_type="none", parallel=PARALLEL, ctx_size=CTX) as plain:
        res.outcomes = _generate({"default": spec, "none": plain}, cases)
        res.seconds = time.monotonic() - start
        checker = format_checker()
        res.failures = {c.id: _check(c, res.outcomes[c.id], checker, lambda *a: _divergence(plain, *a), res.notes)
                        for c in cases}
    _write_report(res, cases, (head, _head()))
    fails = sum(map(len, res.failures.values()))
    print(f"\nconformance: {len(cases)} schemas in {res.seconds:.1f} s, {fails} failures "
          f"(report in {REPORT})")
    return res


# Numbers, times, durations, emails and uris end now (runtime/schema_finite.py: llama.cpp's
# 16 digits and length bounds). What still may not end is a schema without an end of its own: an
# open map takes any count of keys (llama.cpp's grammar the same), and SmolLM2-135M repeats keys
# ("address", "city", "country", ...) until max_tokens, greedy. Marked, not dropped: each still
# runs and is reported in /tmp/conformance.
RUNAWAYS = frozenset({"outside-minProperties", "outside-patternProperties"})
_RUNAWAY = pytest.mark.xfail(reason="an open map has no end: any count of keys is an instance", strict=False)


def _marked(cases):
    return [pytest.param(c, id=c.id, marks=_RUNAWAY) if c.id in RUNAWAYS else pytest.param(c, id=c.id)
            for c in cases]


@pytest.mark.parametrize("case", _marked(CASES))
def test_outputs_match_the_schema(conformance, case):
    """Listed keywords: never refused; greedy and sampled outputs finish and validate; greedy is
    the same text with and without speculation."""
    fails = conformance.failures[case.id]
    assert len(conformance.outcomes[case.id]) == 2 + len(SEEDS)
    assert not fails, "\n".join(f"[{f['mode']}] {f['kind']}: {f['error']}\n    output: {f['output']!r}"
                                for f in fails)


@pytest.mark.parametrize("case", _marked(OUTSIDE_CASES))
def test_a_keyword_outside_the_list_is_enforced_or_refused_by_name(conformance, case):
    """Not on the list: a GrammarError naming the keyword (a 400 in serve), or every output valid."""
    outcomes = conformance.outcomes[case.id]
    refused = sum(o.error is not None for o in outcomes)
    assert refused in (0, len(outcomes)), [o.error for o in outcomes]   # refused every time, or never
    fails = conformance.failures[case.id]
    assert not fails, f"{KEYWORD[case.id]}: " + "; ".join(f"[{f['mode']}] {f['kind']}: {f['error']}: {f['output']!r}"
                                                          for f in fails)


def test_the_corpus_covers_every_listed_keyword():
    """Each keyword of the list (OpenAI strict mode's and llama-server's) in enough schemas."""
    seen: dict[str, int] = {}
    for c in CASES:
        for k in keywords(c.schema) | set(c.tags):
            seen[k] = seen.get(k, 0) + 1
    short = {k: seen.get(k, 0) for k, n in COVERAGE.items() if seen.get(k, 0) < n}
    assert not short, f"keywords in too few schemas: {short}"
    assert len(CASES) >= 200


def test_the_examples_shown_in_prompts_are_instances_of_their_schemas():
    """A prompt's example must not ask for what its schema forbids."""
    schemas = {c.id: c.schema for c in CASES}
    for name, example in EXAMPLES.items():
        Draft202012Validator(schemas[name], format_checker=format_checker()).validate(example)


def test_the_format_checker_checks_every_format_the_corpus_uses():
    """Without rfc3339-validator & co. jsonschema passes date-time, time, duration and hostname
    unchecked: the checker the test uses must refuse a bad value of each format."""
    checker = format_checker()
    used = {k.split(": ", 1)[1] for c in CASES for k in keywords(c.schema) if k.startswith("format: ")}
    assert used <= set(FORMAT_SAMPLES), used - set(FORMAT_SAMPLES)
    for fmt, (good, bad) in FORMAT_SAMPLES.items():
        assert checker.conforms(good, fmt), (fmt, good)
        assert not checker.conforms(bad, fmt), (fmt, bad)
