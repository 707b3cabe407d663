"""Every malformed GGUF of llamaspec.testing.corrupt_gguf through every command that reads a GGUF.

Each (case, command) must end with a documented exit code, a one-line error naming the file and
what is wrong (a byte offset or a key, or llama.cpp's reason), no traceback, within a timeout, and
without changing any file it was given or had produced before. The last test prints the counts.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from hub_server import HubServer, hub_env
from llamaspec.testing.corrupt_gguf import corpus

REPO = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 30  # seconds per invocation: more is a hang
COMMANDS = ("inspect", "check_main", "check_draft", "pair_target", "pair_search", "run_target", "run_draft",
            "bench", "batch", "models", "pull")
HEADER_ONLY = ("inspect", "check_main", "check_draft", "pair_target")
LOADS = ("run_target", "run_draft", "bench", "batch")
RESULTS: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # command -> counter


class Hang(Exception):
    pass


@pytest.fixture(scope="module")
def world(tiny_models, tmp_path_factory):
    """The corpus on disk, a clean copy of the base model, and a batch input."""
    root = tmp_path_factory.mktemp("corpus")
    base = root / "base.gguf"
    shutil.copy(tiny_models["draft"], base)
    cases = corpus(base)
    files = root / "files"
    files.mkdir()
    paths = {c.name: c.write(files) for c in cases}
    (root / "in.jsonl").write_text(json.dumps({"id": "a", "prompt": "hi", "max_tokens": 2}) + "\n")
    return {"root": root, "base": base, "cases": cases, "paths": paths}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "-"


def _flat(text: str) -> str:
    return "".join(text.split())  # rich wraps long lines at 80 columns in captured output


def _allowed(case, cmd: str) -> set[int]:
    if cmd in ("pair_search", "models"):
        return {0}  # a damaged file among others is reported, never fatal
    if cmd == "pull":
        return {0, 1}
    if case.expect == "ok":
        return {0}
    if case.expect == "header":
        return {1}
    if case.expect == "data":
        return {1} if cmd in LOADS else {0}
    return {1} if cmd in LOADS else {0, 1}  # "load": llama.cpp refuses; headers may still compare


def _args(cmd: str, path: Path, w: dict, tmp: Path) -> list[str]:
    base = str(w["base"])
    gen = ["-p", "hi", "-n", "2", "-t", "1", "-c", "64", "--temp", "0"]
    return {
        "inspect": ["inspect", path, "--json"],
        "check_main": ["check", path, base, "--offline", "--json"],
        "check_draft": ["check", base, path, "--offline", "--json"],
        "pair_target": ["pair", path, "--no-default-dirs", "--offline", "--json"],
        "pair_search": ["pair", base, "--no-default-dirs", "--search", _alone(path, tmp), "--offline", "--json"],
        "run_target": ["run", path, *gen, "--spec-type", "none"],
        "run_draft": ["run", base, *gen, "--spec-type", "draft", "--draft", path],
        "bench": ["bench", path, "-p", "hi", "-n", "2", "-t", "1", "-c", "64", "--reps", "1", "--spec-type", "ngram-simple"],
        "batch": ["batch", path, w["root"] / "in.jsonl", "-o", tmp / "out.jsonl", "--force", "--spec-type", "none"],
        "models": ["models", "--json"],
        "pull": ["pull", "org/corrupt", "--json"],
    }[cmd]


def _alone(path: Path, tmp: Path) -> Path:
    """A search directory holding only `path` (next to what pair finds there: nothing else)."""
    d = tmp / "search"
    d.mkdir(exist_ok=True)
    if not (d / path.name).exists():
        (d / path.name).hardlink_to(path)
    return d


def _invoke(run_cli, args):
    """run_cli(*args), ended by SIGALRM (Hang) past the hang guard."""
    def alarm(*_):
        raise Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_GUARD_S)
    try:
        return run_cli(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _hf_cache(home: Path, path: Path) -> None:
    """A Hugging Face cache holding `path` as org/corrupt's only file, as huggingface_hub lays it out."""
    repo = home / "hub" / "models--org--corrupt"
    sha = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    snap = repo / "snapshots" / sha
    snap.mkdir(parents=True)
    shutil.copy(path, snap / "corrupt-Q8_0.gguf")


def _check(case, cmd: str, r, where: str) -> list[str]:
    """What is wrong with one invocation's result (empty: fine)."""
    problems = []
    if "Traceback" in r.stderr or "Traceback" in r.stdout:
        problems.append("traceback")
    if r.exit_code not in _allowed(case, cmd):
        problems.append(f"exit {r.exit_code}, expected {sorted(_allowed(case, cmd))}")
    verdict = cmd.startswith("check") and r.exit_code == 1 and '"compatible": false' in r.stdout
    if r.exit_code != 0 and not verdict:  # (check's "incompatible" is an answer, not an error)
        errors = r.stderr.count("error:")
        if errors != 1:
            problems.append(f"{errors} 'error:' lines")
        flat = _flat(r.stderr).lower()
        # What is wrong: the case's own words for the file llama.cpp or the header reader refused.
        named = cmd in ("inspect", "check_main", "pair_target", "run_target", "bench", "batch") or case.expect != "load"
        if named and case.expect != "ok" and _flat(where).lower() not in flat:
            problems.append(f"message does not name {where!r}")
        if case.expect in ("header", "data") and cmd != "pull" and _flat(case.name).lower() not in flat:
            problems.append("message does not name the file")
    return problems


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_case_through_command(cmd, world, run_cli, tmp_path, monkeypatch):
    failures = []
    server = None
    if cmd == "pull":
        server = HubServer().start()
    try:
        for case in world["cases"]:
            path = world["paths"][case.name]
            before = {p: _digest(p) for p in (path, world["base"])}
            tmp = tmp_path / case.name
            tmp.mkdir()
            if cmd == "batch":  # results produced earlier must survive the failure
                (tmp / "out.jsonl").write_text('{"id": "earlier", "text": "kept"}\n')
            if cmd in ("models", "pull"):
                home = tmp / "hf"
                for k, v in hub_env(server, home).items():
                    monkeypatch.setenv(k, v)
                monkeypatch.delenv("HF_TOKEN", raising=False)
                from huggingface_hub import constants

                monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
                monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
                if cmd == "models":
                    _hf_cache(home, path)
                else:
                    server.add_repo("org/corrupt", {"corrupt-Q8_0.gguf": path.read_bytes()})
            try:
                r = _invoke(run_cli, _args(cmd, path, world, tmp))
            except Hang:
                RESULTS[cmd]["hangs"] += 1
                failures.append(f"{case.name}: hang (> {HANG_GUARD_S} s)")
                continue
            except Exception as exc:  # noqa: BLE001 - an escaped exception is a traceback
                RESULTS[cmd]["tracebacks"] += 1
                failures.append(f"{case.name}: {type(exc).__name__}: {exc}")
                continue
            RESULTS[cmd]["cases"] += 1
            RESULTS[cmd][f"exit {r.exit_code}"] += 1
            problems = _check(case, cmd, r, case.where)
            if cmd == "models" and r.exit_code == 0:
                rows = r.json()["models"]
                if case.expect == "header" and not (rows and "error" in rows[0]):
                    problems.append("models does not mark the file unreadable")
            lost = [str(p) for p, d in before.items() if _digest(p) != d]
            if cmd == "batch" and "earlier" not in (tmp / "out.jsonl").read_text():
                lost.append("out.jsonl")
            if lost:
                RESULTS[cmd]["data lost"] += 1
                problems.append(f"changed: {lost}")
            RESULTS[cmd]["tracebacks"] += "traceback" in problems
            if problems:
                failures.append(f"{case.name}: {'; '.join(problems)} | {' '.join(r.stderr.split())[:300]}")
    finally:
        if server is not None:
            server.stop()
    assert not failures, f"{cmd}: {len(failures)} of {len(world['cases'])} cases failed:\n" + "\n".join(failures)


# A few real processes: what a user's terminal gets (llama.cpp's native log included).
SUBPROCESS_CASES = (("nested_arrays_deep", "run"), ("token_type_count_2g", "run"), ("tokens_as_int", "run"),
                    ("cut_data_middle", "run"), ("unknown_architecture", "run"), ("unknown_tokenizer", "run"),
                    ("missing_tensor", "run"), ("name_invalid_utf8", "inspect"), ("cut_data_middle", "inspect"))


@pytest.mark.parametrize("name, cmd", SUBPROCESS_CASES)
def test_real_process_has_no_traceback(name, cmd, world):
    path = world["paths"][name]
    case = next(c for c in world["cases"] if c.name == name)
    argv = ([cmd, str(path), "-p", "hi", "-n", "2", "-t", "1", "--spec-type", "none"] if cmd == "run"
            else [cmd, str(path), "--json"])
    exe = REPO / ".venv/bin/llamaspec"
    prefix = [str(exe)] if exe.exists() else [sys.executable, "-m", "llamaspec"]
    proc = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env={"COLUMNS": "400", "PATH": "/usr/bin", "LANG": "C.UTF-8"})
    RESULTS[f"{cmd} (subprocess)"]["cases"] += 1
    RESULTS[f"{cmd} (subprocess)"]["tracebacks"] += "Traceback" in proc.stderr
    assert "Traceback" not in proc.stderr
    if cmd == "inspect":  # header-only: works on these files, JSON on a real stdout
        assert proc.returncode == 0, proc.stderr
        json.loads(proc.stdout)
        return
    assert proc.returncode == 1, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and str(path) in ours[0] and case.where.lower() in ours[0].lower(), proc.stderr[-2000:]


def test_summary_table(world):
    """The counts for the record (run with -s to see the table); all-zero failure columns."""
    if not RESULTS:
        pytest.skip("run with the corpus tests")
    cols = ("cases", "tracebacks", "hangs", "data lost")
    lines = [f"{len(world['cases'])} corrupt GGUF cases ({', '.join(f'{k}: {n}' for k, n in _kinds(world).items())})",
             f"{'command':20}" + "".join(f"{c:>11}" for c in cols) + "   exit codes"]
    for cmd, counts in RESULTS.items():
        exits = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()) if k.startswith("exit"))
        lines.append(f"{cmd:20}" + "".join(f"{counts[c]:>11}" for c in cols) + f"   {exits}")
    print("\n" + "\n".join(lines))
    assert all(RESULTS[c]["tracebacks"] == 0 and RESULTS[c]["hangs"] == 0 and RESULTS[c]["data lost"] == 0
               for c in RESULTS)


def _kinds(world) -> dict[str, int]:
    kinds: dict[str, int] = defaultdict(int)
    for c in world["cases"]:
        kinds[c.expect] += 1
    return dict(kinds)
