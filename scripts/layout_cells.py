"""The prompts and the run, batch and serve cells of scripts/bench_layouts.py (issue 33).

A prompt is a dict: id, kind (code, prose, extract, extract+schema), text (the user message),
system (or None) and schema (a JSON schema, or None). The extraction prompts come from
scripts/extraction_batch.jsonl (a system message, one worked example, the request): `run` takes
one user message, so the example is folded into it ("Example:" the example request and its
answer, "Now:" the request), and every cell kind gets that same message, with the schema (as
`run -j`, a batch line's `json_schema`) in the +schema variant only.

A batch cell is one `llamaspec batch MODEL JOB -o OUT --parallel P -n N` process per mode on a
JSONL of all the prompts kept (own line form: id, messages, json_schema), timed from its start to
its exit (model, draft, probes included); tokens = the records' n_generated. A serve cell is one
`llamaspec serve MODEL --parallel P -c C` per mode under scripts/bench_serve.py's mixed load (its
prompts, clients and client code), timed by bench_serve.run_load from the first request to the
last answer, after an untimed warm-up request.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [p for p in (str(HERE), str(REPO)) if p not in sys.path]

from bench_serve import LOADS, BenchError, Server, percentile, post_chat, run_load  # noqa: E402

from llamaspec.bench.prompts import preset_text  # noqa: E402

EXTRACT_IDS = ["contact-0", "order-0", "bug-0"]   # three of the five schemas
RUN_TIMEOUT = 900.0
BATCH_TIMEOUT = 3600.0
_GEN = re.compile(r"generated (\d+) tokens in ([\d.]+) s: ([\d.]+) tok/s")
_SPEC = re.compile(r"^spec (\S+)(?:\s+draft (\S+))?", re.M)


def mode_args(mode: str) -> list[str]:
    return [] if mode == "default" else ["--spec-type", "none" if mode == "plain" else mode]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _extraction(line: dict, schema: bool) -> dict:
    msgs = line["body"]["messages"]
    system = next((m["content"] for m in msgs if m["role"] == "system"), None)
    turns = [m for m in msgs if m["role"] != "system"]
    *example, last = turns
    text = last["content"]
    if example:
        shown = "\n\n".join(("Answer: " if m["role"] == "assistant" else "") + m["content"] for m in example)
        text = f"Example:\n\n{shown}\n\nNow:\n\n{text}"
    rf = line["body"].get("response_format") or {}
    sch = rf.get("json_schema", {}).get("schema") if schema else None
    kind = "extract+schema" if schema else "extract"
    return {"id": line["custom_id"] + ("+schema" if schema else ""), "kind": kind, "text": text,
            "system": system, "schema": sch}


def all_prompts() -> list[dict]:
    """The four code edits, the prose prompt, and three extractions without and with their schema."""
    code = [json.loads(x) for x in (HERE / "code_edits.jsonl").read_text().splitlines() if x.strip()]
    out = [{"id": str(d["id"]), "kind": "code", "text": d["prompt"], "system": None, "schema": None} for d in code]
    out.append({"id": "story", "kind": "prose", "text": preset_text("story"), "system": None, "schema": None})
    job = {d["custom_id"]: d for d in (json.loads(x) for x in (HERE / "extraction_batch.jsonl").read_text().splitlines()
                                       if x.strip())}
    for schema in (False, True):
        out += [_extraction(job[i], schema) for i in EXTRACT_IDS]
    return out


def select_prompts(only: list[str] | None) -> list[dict]:
    """All prompts, or those whose id or kind is in `only`."""
    prompts = all_prompts()
    if not only:
        return prompts
    known = {p["id"] for p in prompts} | {p["kind"] for p in prompts}
    unknown = sorted(set(only) - known)
    if unknown:
        raise BenchError(f"--prompt: no prompt or kind {', '.join(unknown)} (ids: "
                         f"{', '.join(p['id'] for p in prompts)}; kinds: code, prose, extract, extract+schema)")
    return [p for p in prompts if p["id"] in only or p["kind"] in only]


def run_prompt_args(p: dict) -> list[str]:
    """`llamaspec run` arguments for a prompt: -p, and --system and -j where it has them."""
    args = ["-p", p["text"]]
    if p["system"]:
        args += ["--system", p["system"]]
    if p["schema"] is not None:
        args += ["-j", json.dumps(p["schema"])]
    return args


# ---- run ------------------------------------------------------------------------------------------

def run_once(model: Path, prompt: dict, n: int, temp: float, threads: int, mode: str, seed: int | None) -> dict:
    """One `llamaspec run` in its own process: text, tokens, time to the last token and to exit."""
    cmd = [sys.executable, "-m", "llamaspec", "run", str(model), *run_prompt_args(prompt), "-n", str(n),
           "--temp", str(temp), "-t", str(threads), "--offline", *mode_args(mode)] + \
        (["-s", str(seed)] if seed is not None else [])
    chunks: list[bytes] = []
    last = [0.0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())

    def read_out() -> None:
        while True:
            b = os.read(proc.stdout.fileno(), 65536)
            if not b:
                return
            chunks.append(b)
            last[0] = time.perf_counter() - t0

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    try:
        err = proc.stderr.read().decode("utf-8", "replace")
        proc.wait(timeout=RUN_TIMEOUT)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    wall = time.perf_counter() - t0
    reader.join()
    if proc.returncode != 0:
        tail = " | ".join(err.strip().splitlines()[-3:])
        raise BenchError(f"{model.name} {mode}: `llamaspec run` exited {proc.returncode}: {tail}")
    m = _GEN.search(err)
    if not m:
        raise BenchError(f"{model.name} {mode}: no 'generated N tokens' line in run's stats: {err[-300:]}")
    spec = _SPEC.search(err)
    tokens = int(m.group(1))
    to_last = last[0] or wall
    return {"texts": {prompt["id"]: b"".join(chunks).decode("utf-8", "replace")}, "tokens": tokens,
            # run's own generation time, from its tok/s (its seconds are printed to 0.01 s)
            "gen_s": tokens / float(m.group(3)) if float(m.group(3)) > 0 else float(m.group(2)),
            "to_last_s": round(to_last, 4), "wall_s": round(wall, 4), "tok_s": tokens / to_last if to_last > 0 else 0.0,
            "spec": spec.group(1) if spec else None, "draft": spec.group(2) if spec else None}


# ---- batch --parallel P ---------------------------------------------------------------------------

def batch_line(p: dict, n: int) -> dict:
    msgs = [{"role": "system", "content": p["system"]}] if p["system"] else []
    msgs.append({"role": "user", "content": p["text"]})
    line = {"id": p["id"], "messages": msgs, "max_tokens": n}
    if p["schema"] is not None:
        line["json_schema"] = p["schema"]
    return line


def run_batch(model: Path, prompts: list[dict], n: int, temp: float, threads: int, mode: str, seed: int | None,
              parallel: int) -> dict:
    """One `llamaspec batch --parallel P` process on a JSONL of the prompts: texts by id, tokens
    (the records' n_generated), time from the process's start to its exit."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_layouts_batch_"))
    try:
        job, out = tmp / "job.jsonl", tmp / "out.jsonl"
        job.write_text("".join(json.dumps(batch_line(p, n)) + "\n" for p in prompts))
        cmd = [sys.executable, "-m", "llamaspec", "batch", str(model), str(job), "-o", str(out), "--parallel",
               str(parallel), "-n", str(n), "--temp", str(temp), "-t", str(threads), "--offline", "--json", "-q",
               *mode_args(mode)] + (["-s", str(seed)] if seed is not None else [])
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                                  timeout=BATCH_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            raise BenchError(f"{model.name} {mode}: `llamaspec batch` did not finish in {BATCH_TIMEOUT:g} s") from e
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise BenchError(f"{model.name} {mode}: `llamaspec batch` exited {done.returncode}: {tail}")
        recs = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = [f"{r.get('id')}: {r['error']}" for r in recs if r.get("error")]
    if failed or len(recs) != len(prompts):
        raise BenchError(f"{model.name} {mode}: batch records {len(recs)}/{len(prompts)}, failed: {failed[:3]}")
    summary = json.loads(done.stdout) if done.stdout.strip() else {}
    tokens = sum(r["n_generated"] for r in recs)
    first = recs[0]
    return {"texts": {r["id"]: r["text"] for r in recs}, "tokens": tokens, "to_last_s": round(wall, 4),
            "wall_s": round(wall, 4), "tok_s": tokens / wall if wall > 0 else 0.0,
            "job_s": round(summary.get("seconds") or 0.0, 4), "spec": first.get("spec_type"),
            "draft": first.get("draft_model"), "drafted": summary.get("drafted"), "accepted": summary.get("accepted")}


# ---- serve --parallel P, the mixed load -----------------------------------------------------------

def serve_load(n: int | None = None) -> tuple[list[tuple[str, str]], dict]:
    """bench_serve's mixed load: its prompts and run_load's clients, requests, n (max_tokens: the
    load's 128 unless given) and pick."""
    make_prompts, clients, requests, load_n, pick = LOADS["mixed"]
    prompts = make_prompts()
    return prompts, dict(clients=clients, requests=requests, n=n or load_n,
                         pick=lambda c, k: pick(c, k, clients, len(prompts)))


def run_serve(model: Path, temp: float, seeds: list[int | None], threads: int, mode: str, parallel: int,
              ctx: int, n: int, logdir: Path) -> list[dict]:
    """One `llamaspec serve --parallel P -c C` in this mode; after an untimed warm-up request, the
    mixed load (max_tokens n) once per seed. One result per seed: texts by request, tokens, tok/s, latencies."""
    prompts, load = serve_load(n)
    cmd = [sys.executable, "-m", "llamaspec", "serve", str(model), "--parallel", str(parallel), "-c", str(ctx),
           "-t", str(threads), "--temp", str(temp), "--offline", *mode_args(mode)]
    out = []
    with Server(f"serve {model.parent.name} {mode}", cmd, logdir, source=REPO) as server:
        warm = post_chat(server.port, "Say hello.", 8)
        if warm["status"] != 200:
            raise BenchError(f"{server.label}: warm-up request failed: {warm['status']} {warm.get('error', '')}")
        for seed in seeds:
            r = run_load(server.port, prompts, temperature=temp, seed=seed, **load)
            if r["errors"]:
                raise BenchError(f"{server.label}: {r['total'] - r['ok']} request(s) failed: {r['errors'][:2]}")
            out.append(r)
        log = server.output()
    spec = re.search(r", spec ([^\s,)]+(?:,[^\s,)]+)*)", log)   # "serving M on URL (context ..., spec X)"
    draft = re.search(r"draft\b[^\n]*?([^\s/'\"()]+\.gguf)", log)   # a note naming the draft it took
    spec = spec.group(1) if spec else None
    draft = draft.group(1) if draft and spec and "draft" in spec else None
    names = [f"{i}:{prompts[load['pick'](ci, k)][0]}"   # run_load's results are in (client, request) order
             for i, (ci, k) in enumerate((ci, k) for ci in range(load["clients"]) for k in range(load["requests"]))]
    return [{"texts": dict(zip(names, r["texts"])), "tokens": r["tokens"], "to_last_s": r["wall_s"],
             "wall_s": r["wall_s"], "tok_s": r["tok_s"], "latencies": r["latencies"], "spec": spec, "draft": draft}
            for r in out]


def pooled_latency(results: list[dict]) -> dict:
    lat = [x for r in results for x in r.get("latencies", [])]
    return {"p50_s": round(percentile(lat, 50), 3), "p95_s": round(percentile(lat, 95), 3)} if lat else {}
