#!/usr/bin/env python3
"""Structured output, one command (issue 26): a batch job of JSON-schema extraction requests run by
`llamaspec batch` plain and with its default speculation, and by llama.cpp's llama-server with
the `json_schema` field, plain and with each of its model-free speculative types, side by side.

  llamaspec plain     llamaspec batch MODEL JOB -o OUT -t T -c C --temp 0 --spec-type none --json
  llamaspec default   the same without --spec-type (its default speculation)
  llama-server plain  llama-server -m MODEL -np 1 -t T -c C --temp 0 --no-webui -ngl 0; the job's
                      requests sent one at a time, each with json_schema = the line's schema
  llama-server X      the same plus --spec-type X for each of ngram-simple / ngram-mod / ngram-map-k
                      that this build's --help lists (--native-spec "ARGS", repeatable, replaces them)

All sequential: batch without --parallel, llama-server -np 1 with one request in flight. With
--reps N every side runs N times, interleaved (rep r starts at side r, rotating); the table gives
medians. Job wall time: from the first request to the last response (batch: its --json summary's
`seconds`, which starts after the model is loaded, with no warm-up request; llama-server: around
the request loop, after an untimed warm-up request). tok/s: each side's generated tokens over that time (llama-server counts
the end-of-generation token of a request that stops; llamaspec does not: `job x` compares wall
times of the same 40 requests). Every record is validated against its schema (`jsonschema`), and
the default run's texts are compared with plain's request by request; where they differ the two
are rerun once, untimed, with logprobs (top 5) on those requests, and the logprob gap between the
two tokens at the first difference is printed (below --eps: a near tie, batch-shape float noise).

With --constraint-cost, both servers' plain sides also run the job with every schema taken out
(`plain, no schema`): a constraint's cost in plain decoding is (tok/s with schema) / (tok/s
without) on each server, and the line "constraint cost" compares ours with llama-server's (issue
34: ours >= 0.95 of theirs). Texts without a schema are not validated.

    .venv/bin/python scripts/bench_structured.py MODEL --reps 5 --native-bin /work/native/build/bin \
        [--job scripts/extraction_batch.jsonl] [-t 2] [-c 4096] [--only llamaspec] [--constraint-cost] [--json FILE]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_serve import NATIVE_CANDIDATES, REQUEST_TIMEOUT, BenchError, Server, run_script  # noqa: E402

DEFAULT_JOB = HERE / "extraction_batch.jsonl"


def read_job(path: Path) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    for ln in lines:
        if "custom_id" not in ln or "body" not in ln:
            raise BenchError(f"{path}: every line must be in OpenAI's batch form (custom_id, body)")
    return lines


def line_schema(body: dict) -> dict | None:
    rf = body.get("response_format") or {}
    if rf.get("type") == "json_schema":
        return rf["json_schema"]["schema"]
    return {} if rf.get("type") == "json_object" else body.get("json_schema")


NO_SCHEMA = "plain, no schema"


def without_schemas(lines: list[dict]) -> list[dict]:
    """The job with every line's constraint taken out (response_format, json_schema)."""
    return [{**ln, "body": {k: v for k, v in ln["body"].items() if k not in ("response_format", "json_schema")}}
            for ln in lines]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---- llamaspec batch ----------------------------------------------------------------------------

def run_batch(cmd: list[str], job: Path, out: Path) -> dict:
    """One `llamaspec batch` job; per-request results keyed by custom_id, and the job summary."""
    full = cmd[:5] + [str(job), "-o", str(out)] + cmd[5:]   # [python -m llamaspec batch MODEL] JOB -o OUT ...
    t0, before = time.perf_counter(), load()
    done = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process_s = time.perf_counter() - t0
    if done.returncode != 0 and not out.is_file():
        raise BenchError(f"{shlex.join(full)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    summary = json.loads(done.stdout) if done.stdout.strip() else {}
    results = {}
    for raw in out.read_text().splitlines():
        rec = json.loads(raw)
        results[rec["custom_id"]] = _batch_result(rec)
    return {"wall_s": summary.get("seconds"), "process_s": round(process_s, 2), "summary": summary,
            "results": results, "load_before": before, "load_after": load(), "exit": done.returncode}


def _batch_result(rec: dict) -> dict:
    resp = rec.get("response") or {}
    body = resp.get("body") or {}
    if resp.get("status_code") != 200:
        err = (body.get("error") or {}).get("message") or rec.get("error")
        return {"text": None, "tokens": 0, "finish": None, "error": str(err)[:300]}
    choice = body["choices"][0]
    t = body.get("timings") or {}
    return {"text": choice["message"]["content"], "tokens": body["usage"]["completion_tokens"],
            "finish": choice["finish_reason"], "logprobs": choice.get("logprobs"),
            "drafted": t.get("draft_n"), "accepted": t.get("draft_n_accepted"),
            "per_drafter": _find(body, "per_drafter")}


def _find(obj, key: str):
    """The first value under `key` anywhere in a record body (the per-drafter counts a batch record
    may carry, e.g. beside llama-server's `timings`); None if there is none."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            if (hit := _find(v, key)) is not None:
                return hit
    return None


# ---- llama-server -------------------------------------------------------------------------------

def post(port: int, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        status, data = resp.status, resp.read()
    finally:
        conn.close()
    if status != 200:
        return {"text": None, "tokens": 0, "finish": None, "error": f"{status}: {data[:300].decode(errors='replace')}"}
    r = json.loads(data)
    t = r.get("timings") or {}
    return {"text": r["choices"][0]["message"]["content"], "tokens": r["usage"]["completion_tokens"],
            "finish": r["choices"][0]["finish_reason"], "drafted": t.get("draft_n", 0),
            "accepted": t.get("draft_n_accepted", 0)}


def server_body(line: dict) -> dict:
    """The line's request as llama-server takes it: the same messages, max_tokens, temperature, and
    its schema in llama-server's own `json_schema` field."""
    b = line["body"]
    out = {"messages": b["messages"], "max_tokens": b.get("max_completion_tokens") or b.get("max_tokens"),
           "temperature": b.get("temperature", 0), "stream": False}
    schema = line_schema(b)
    if schema is not None:
        out["json_schema"] = schema
    return out


def run_server(server: Server, lines: list[dict]) -> dict:
    with server:
        warm = post(server.port, {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8})
        if warm["text"] is None:
            raise BenchError(f"{server.label}: warm-up request failed: {warm['error']}")
        before = load()
        t0 = time.perf_counter()
        results = {ln["custom_id"]: post(server.port, server_body(ln)) for ln in lines}
        wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 3), "results": results, "load_before": before, "load_after": load()}


def native_types(native: Path) -> list[list[str]]:
    """bench_serve's llama-server candidates that this build's --help lists."""
    text = subprocess.run([str(native), "--help"], capture_output=True, text=True).stdout
    m = re.search(r"--spec-type (\S+)", text)
    listed = set(m.group(1).split(",")) if m else set()
    return [c for c in NATIVE_CANDIDATES if c[1] in listed]


# ---- judging -----------------------------------------------------------------------------------

def validate(results: dict, lines: list[dict]) -> list[str]:
    """custom_ids whose text is missing, not JSON, or not valid under the line's schema."""
    import jsonschema

    bad = []
    for ln in lines:
        r, schema = results.get(ln["custom_id"]), line_schema(ln["body"])
        if schema is None and "response_format" not in ln["body"]:   # (a no-schema side: any text)
            continue
        try:
            jsonschema.validate(json.loads(r["text"]), schema or {})
        except (TypeError, ValueError, jsonschema.ValidationError):
            bad.append(ln["custom_id"])
    return bad


def differing(a: dict, b: dict) -> list[str]:
    return [k for k in a if a[k]["text"] != b.get(k, {}).get("text")]


def near_ties(cmds: dict, lines: list[dict], ids: list[str], tmp: Path, eps: float) -> list[dict]:
    """Reruns plain and default once on the differing requests with logprobs (top 5) and names the
    logprob gap, in plain's row, between the two tokens at the first difference."""
    sub = tmp / "differing.jsonl"
    with open(sub, "w") as f:
        for ln in lines:
            if ln["custom_id"] in ids:
                f.write(json.dumps({**ln, "body": {**ln["body"], "logprobs": True, "top_logprobs": 5}}) + "\n")
    got = {}
    for mode in ("plain", "default"):
        r = run_batch(cmds[mode], sub, tmp / f"logprobs_{mode}.jsonl")
        got[mode] = r["results"]
    out = []
    for cid in ids:
        p, d = got["plain"].get(cid, {}), got["default"].get(cid, {})
        lp, ld = (p.get("logprobs") or {}).get("content"), (d.get("logprobs") or {}).get("content")
        entry = {"id": cid}
        if not lp or not ld:
            entry["verdict"] = "logprobs not available: " + (p.get("error") or d.get("error") or "no logprobs in records")
            out.append(entry)
            continue
        i = next((j for j, (x, y) in enumerate(zip(lp, ld)) if x["token"] != y["token"]), None)
        if i is None:
            entry["verdict"] = "identical in the logprobs rerun" if len(lp) == len(ld) else "one is a prefix of the other"
            out.append(entry)
            continue
        top = {t["token"]: t["logprob"] for t in lp[i]["top_logprobs"]}
        chosen, other = lp[i]["token"], ld[i]["token"]
        gap = lp[i]["logprob"] - top[other] if other in top else None
        low = lp[i]["logprob"] - min(top.values()) if top else None
        entry.update(token=i, plain=chosen, default=other, gap=None if gap is None else round(gap, 4))
        entry["verdict"] = (f"gap {gap:.4f}: " + ("near tie" if abs(gap) < eps else "NOT A NEAR TIE")) if gap is not None \
            else f"{other!r} not in plain's top 5 (gap > {low:.3f}): NOT A NEAR TIE"
        out.append(entry)
    return out


def drafter_counts(cmd: list[str], lines: list[dict], tmp: Path, runs: list[dict]) -> dict:
    """Drafted / accepted per drafter of the default side. An OpenAI-form record has no place for
    them (when it has, they are read from the first rep); else the job runs once more, untimed, in
    llamaspec's own line form, whose records carry the engine's stats (`per_drafter`)."""
    per: dict[str, dict[str, int]] = {}
    found = [r["per_drafter"] for r in runs[0]["results"].values() if r.get("per_drafter")]
    source = "the first rep's records"
    if not found:
        own = tmp / "own_form.jsonl"
        own.write_text("".join(json.dumps({"id": ln["custom_id"], **{k: v for k, v in ln["body"].items() if k != "model"}})
                               + "\n" for ln in lines))
        full = cmd[:5] + [str(own), "-o", str(tmp / "own_form_out.jsonl")] + cmd[5:]
        subprocess.run(full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        recs = [json.loads(x) for x in (tmp / "own_form_out.jsonl").read_text().splitlines()] \
            if (tmp / "own_form_out.jsonl").is_file() else []
        found = [r.get("per_drafter") or {} for r in recs]
        source = "an untimed rerun in llamaspec's own line form"
    for pd in found:
        for name, c in pd.items():
            acc = per.setdefault(name, {"drafted": 0, "accepted": 0})
            acc["drafted"] += c.get("drafted", 0)
            acc["accepted"] += c.get("accepted", 0)
    s = runs[0]["summary"]
    return {"total": {"drafted": s.get("drafted"), "accepted": s.get("accepted")}, "per_drafter": per,
            "per_drafter_from": source}


def summarize(runs: list[dict], lines: list[dict]) -> dict:
    tokens = [sum(r["tokens"] for r in run["results"].values()) for run in runs]
    walls = [run["wall_s"] for run in runs]
    rates = [t / w for t, w in zip(tokens, walls)]
    invalid = [validate(run["results"], lines) for run in runs]
    first = runs[0]["results"]
    unstable = sorted({k for run in runs[1:] for k in differing(first, run["results"])})
    return {"wall_s": round(statistics.median(walls), 2), "tok_s": round(statistics.median(rates), 2),
            "tokens": tokens[0], "wall_s_reps": [round(w, 2) for w in walls], "tok_s_reps": [round(x, 1) for x in rates],
            "invalid": max(len(x) for x in invalid), "invalid_ids": sorted({i for x in invalid for i in x}),
            "invalid_texts": {i: (first[i]["text"] or "")[:200] for i in invalid[0]},
            "errors": sorted({r.get("error", "") for r in first.values() if r.get("error")}),
            "stop": sum(r["finish"] == "stop" for r in first.values()),
            # llama-server: each response's timings; llamaspec batch: its job summary
            "drafted": runs[0].get("summary", {}).get("drafted", sum(r.get("drafted") or 0 for r in first.values())),
            "accepted": runs[0].get("summary", {}).get("accepted", sum(r.get("accepted") or 0 for r in first.values())),
            "unstable_across_reps": unstable, "load_before": [run["load_before"] for run in runs],
            "load_after": [run["load_after"] for run in runs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB, help="OpenAI batch JSONL (default: the 40 extractions)")
    ap.add_argument("--native-bin", type=Path, help="directory with llama.cpp's llama-server (omitted: llamaspec only)")
    ap.add_argument("--native-spec", action="append", metavar="ARGS", help="llama-server speculative arguments "
                    "to measure (repeatable; default: its n-gram types)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--only", choices=["llamaspec", "llama-server"])
    ap.add_argument("--eps", type=float, default=0.1, help="logprob gap below which a difference is a near tie")
    ap.add_argument("--constraint-cost", action="store_true",
                    help="also run each server's plain side without the schemas (the constraint's cost)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write the whole result here")
    a = ap.parse_args()
    if not a.model.is_file():
        raise BenchError(f"MODEL: no such file: {a.model}")
    if min(a.threads, a.ctx_size, a.reps) < 1:
        raise BenchError("-t, -c and --reps must be at least 1")
    lines = read_job(a.job)
    free_lines = without_schemas(lines)
    t, c, model = str(a.threads), str(a.ctx_size), str(a.model)
    batch = [sys.executable, "-m", "llamaspec", "batch", model, "-t", t, "-c", c, "--temp", "0", "--json", "-q"]
    cmds = {"plain": batch + ["--spec-type", "none"], "default": batch}
    sides: list[tuple[str, str, list[str]]] = []
    if a.only != "llama-server":
        sides += [("llamaspec", "plain", cmds["plain"]), ("llamaspec", "default", cmds["default"])]
        if a.constraint_cost:
            sides.append(("llamaspec", NO_SCHEMA, cmds["plain"]))
    if a.native_bin is not None and a.only != "llamaspec":
        native = a.native_bin / "llama-server"
        if not native.is_file():
            raise BenchError(f"--native-bin: no llama-server in {a.native_bin}")
        base = [str(native), "-m", model, "-np", "1", "-t", t, "-c", c, "--temp", "0", "--no-webui", "-ngl", "0"]
        cands = [shlex.split(s) for s in a.native_spec] if a.native_spec else native_types(native)
        sides.append(("llama-server", "plain", base))
        if a.constraint_cost:
            sides.append(("llama-server", NO_SCHEMA, base))
        sides += [("llama-server", shlex.join(x).replace("--spec-type ", ""), base + x) for x in cands]
    runs: dict[int, list[dict]] = {i: [] for i in range(len(sides))}
    failed: dict[int, str] = {}
    out = {"model": model, "job": str(a.job), "requests": len(lines), "threads": a.threads, "ctx_size": a.ctx_size,
           "reps": a.reps, "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    with tempfile.TemporaryDirectory(prefix="bench_structured_") as tmpdir:
        tmp = Path(tmpdir)
        free_job = tmp / "no_schema.jsonl"
        free_job.write_text("".join(json.dumps(ln) + "\n" for ln in free_lines))
        for rep in range(a.reps):
            order = list(range(len(sides)))
            for i in order[rep % len(order):] + order[:rep % len(order)]:
                who, mode, cmd = sides[i]
                if i in failed:
                    continue
                free = mode == NO_SCHEMA
                try:
                    if who == "llamaspec":
                        r = run_batch(cmd, free_job if free else a.job, tmp / f"{mode.replace(', ', '_')}_{rep}.jsonl")
                    else:
                        r = run_server(Server(f"{who} {mode}", cmd, tmp), free_lines if free else lines)
                except BenchError as e:
                    print(f"  {who} {mode}: failed: {e}", file=sys.stderr)
                    failed[i] = str(e)
                    continue
                runs[i].append(r)
                toks = sum(x["tokens"] for x in r["results"].values())
                print(f"  rep {rep + 1} {who} {mode}: {r['wall_s']:.1f} s, {toks / r['wall_s']:.1f} tok/s, "
                      f"load {r['load_before'][0]} -> {r['load_after'][0]}", file=sys.stderr)
        rows = {(who, mode): {"server": who, "mode": mode, "threads": a.threads, "cmd": shlex.join(cmd),
                              **summarize(runs[i], free_lines if mode == NO_SCHEMA else lines)}
                for i, (who, mode, cmd) in enumerate(sides) if runs[i]}
        checks: dict = {}
        plain, spec = rows.get(("llamaspec", "plain")), rows.get(("llamaspec", "default"))
        if plain and spec:
            ip, idf = sides.index(("llamaspec", "plain", cmds["plain"])), sides.index(("llamaspec", "default", cmds["default"]))
            diff = differing(runs[ip][0]["results"], runs[idf][0]["results"])
            checks["default vs plain"] = {"identical": len(lines) - len(diff), "compared": len(lines), "differing": diff,
                                          "near_ties": near_ties(cmds, lines, diff, tmp, a.eps) if diff else []}
            out["drafters"] = drafter_counts(cmds["default"], lines, tmp, runs[idf])
        ns_plain = next((i for i, s in enumerate(sides) if s[:2] == ("llama-server", "plain")), None)
        if ns_plain is not None and runs[ns_plain]:
            for i, (who, mode, _) in enumerate(sides):
                if runs[i] and i != ns_plain and mode != NO_SCHEMA:
                    diff = differing(runs[ns_plain][0]["results"], runs[i][0]["results"])
                    checks[f"{who} {mode} vs llama-server plain"] = {"identical": len(lines) - len(diff),
                                                                     "compared": len(lines), "differing": diff}
    natives = [k for k in rows if k[0] == "llama-server" and k[1] not in ("plain", NO_SCHEMA)]   # (a spec type, with the schema)
    best = max(natives, key=lambda k: rows[k]["tok_s"], default=None)
    ratios = {}
    for name, ref in (("plain", plain), ("llama-server plain", rows.get(("llama-server", "plain"))),
                      (f"llama-server best spec ({best[1] if best else '-'})", rows.get(best) if best else None)):
        if spec and ref:
            ratios[f"default / {name}"] = {"job": round(ref["wall_s"] / spec["wall_s"], 3),
                                           "tok_s": round(spec["tok_s"] / ref["tok_s"], 3)}
    cost = {}
    for who in ("llamaspec", "llama-server"):
        w, wo = rows.get((who, "plain")), rows.get((who, NO_SCHEMA))
        if w and wo:
            cost[who] = round(w["tok_s"] / wo["tok_s"], 3)   # with schema / without, plain decoding
    if len(cost) == 2:
        cost["ours / theirs"] = round(cost["llamaspec"] / cost["llama-server"], 3)
    out["constraint_cost"] = cost
    out.update(uptime_end=subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
               sides=list(rows.values()) + [{"server": sides[i][0], "mode": sides[i][1], "error": e}
                                            for i, e in failed.items()],
               best_native_spec=best[1] if best else None, ratios=ratios, checks=checks)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    report(out)
    return 0


def report(out: dict) -> None:
    print(f"{Path(out['model']).name}: {out['requests']} requests ({Path(out['job']).name}), sequential, -t "
          f"{out['threads']} -c {out['ctx_size']} on both, {out['reps']} rep(s), medians")
    print(f"uptime at start: {out['uptime_start']}\nuptime at end:   {out['uptime_end']}")
    hdr = f"{'side':<28}{'job s':>8}{'tok/s':>8}{'tokens':>8}{'invalid':>8}{'stop':>6}{'accepted':>12}  load1 before  tok/s per rep"
    print(hdr + "\n" + "-" * len(hdr))
    for r in out["sides"]:
        name = f"{r['server']} {r['mode']}"
        if "error" in r:
            print(f"{name:<28}failed: {r['error'][:100]}")
            continue
        print(f"{name:<28}{r['wall_s']:>8.1f}{r['tok_s']:>8.1f}{r['tokens']:>8}{r['invalid']:>8}{r['stop']:>6}"
              f"{str(r['accepted']) + '/' + str(r['drafted']):>12}  "
              f"{' '.join(str(x[0]) for x in r['load_before']):<12}  {' '.join(str(x) for x in r['tok_s_reps'])}")
        if r["invalid_ids"] or r["errors"] or r["unstable_across_reps"]:
            print(f"{'':<4}invalid: {r['invalid_ids']} errors: {r['errors'][:2]} unstable: {r['unstable_across_reps']}")
    for k, v in out["ratios"].items():
        print(f"{k}: job {v['job']:.2f}x, tok/s {v['tok_s']:.2f}x")
    if cost := out.get("constraint_cost"):
        print("constraint cost in plain decoding (tok/s with schema / without): "
              + ", ".join(f"{k} {v:.3f}" for k, v in cost.items()))
    for k, ch in out["checks"].items():
        print(f"texts {k}: {ch['identical']}/{ch['compared']} identical" + (f", differing {ch['differing']}"
                                                                           if ch["differing"] else ""))
        for nt in ch.get("near_ties", []):
            print(f"  {nt['id']}: " + (f"token {nt['token']} {nt['plain']!r} vs {nt['default']!r}, " if "token" in nt else "")
                  + nt["verdict"])
    if d := out.get("drafters"):
        tot = d["total"]
        print(f"default's drafts (rep 1): accepted {tot['accepted']}/{tot['drafted']}; per drafter (from "
              f"{d['per_drafter_from']}): " + ", ".join(f"{name} {c['accepted']}/{c['drafted']}"
                                                       for name, c in d["per_drafter"].items()))


if __name__ == "__main__":
    run_script(main, "bench_structured")
