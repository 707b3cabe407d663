#!/usr/bin/env python3
"""Throughput under load: `llamaspec serve` against llama.cpp's llama-server, side by side in one run.

Each server runs in turn as a subprocess on a free 127.0.0.1 port; the script waits for /health
(HTTP 200), sends one untimed warm-up request, measures, then stops the server and waits for it:

  llamaspec plain      llamaspec serve MODEL --parallel P -t T --temp 0 --spec-type none
  llamaspec spec       llamaspec serve MODEL --parallel P -t T --temp 0   (its default speculation)
  llamaspec draft      the same with --draft DRAFT                        (only with --draft)
  llama-server plain   llama-server -m MODEL -np P -t T -c P*CTX --temp 0 --no-webui -ngl 0
  llama-server spec    the same plus its best speculative setting, picked by a short probe (P
                       clients x 1 request) among --spec-type ngram-simple / ngram-mod / ngram-map-k
                       (llama.cpp's default parameters) and, with --draft, draft-simple -md DRAFT;
                       --native-spec "ARGS" (repeatable) replaces the candidates, one skips the probe

On a CPU with AMX, llama-server puts weights in ggml's AMX buffer by default (F16 ones too), and
with a quantized draft it segfaults in ggml_backend_amx_mul_mat at start-up (llama.cpp issue 20824;
llamaspec never uses that buffer, README "CPUs with AMX"): its draft-simple candidate gets
--no-repack there (no extra buffer types, as llamaspec). --native-args "ARGS" adds arguments to
every llama-server run (--native-args=--no-repack: llama-server on llamaspec's weight layout).

CTX is llamaspec's context per slot (from its start-up line): llama-server splits -c across slots.

Load: C client threads, each sending R requests one after another to /v1/chat/completions: the
bundled code-rewrite prompts (llamaspec/prompts/*.txt) as user messages, cycling, max_tokens n,
temperature 0, stream false. Throughput = completion tokens of all requests / wall seconds from the
first request to the last answer; p50/p95 of per-request latency. Greedy texts of each speculative
mode are compared request by request with its server's plain mode (and llama-server's plain with
llamaspec's plain, for information). Note: llama-server counts the end-of-generation token in
`completion_tokens` when a request stops early; llamaspec does not (column `stop`).

    python scripts/bench_serve.py MODEL [--draft DRAFT] [--native-bin DIR] [--clients 8]
        [--requests 4] [-n 128] [-t 2] [--parallel 4] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.bench.prompts import PROMPT_PRESETS, preset_text  # noqa: E402

NATIVE_CANDIDATES = [["--spec-type", "ngram-simple"], ["--spec-type", "ngram-mod"], ["--spec-type", "ngram-map-k"]]
START_TIMEOUT = 180.0
REQUEST_TIMEOUT = 900.0


class BenchError(Exception):
    pass


def code_prompts() -> list[tuple[str, str]]:
    """(name, text) of the bundled code-rewrite prompts: the presets backed by a prompts/*.txt file."""
    return [(name, preset_text(name)) for name, value in PROMPT_PRESETS.items() if value.endswith(".txt")]


def cpu_has_amx() -> bool:
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def post_chat(port: int, text: str, n: int) -> dict:
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": text}], "max_tokens": n,
                       "temperature": 0, "stream": False}).encode()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        status, data = resp.status, resp.read()
    except OSError as e:
        status, data = None, str(e).encode()
    finally:
        conn.close()
    out = {"status": status, "latency": time.perf_counter() - t0, "text": None, "tokens": 0, "finish": None,
           "draft_n": 0, "draft_accepted": 0}
    if status == 200:
        r = json.loads(data)
        t = r.get("timings") or {}
        out.update(text=r["choices"][0]["message"]["content"], tokens=r["usage"]["completion_tokens"],
                   finish=r["choices"][0]["finish_reason"], draft_n=t.get("draft_n", 0),
                   draft_accepted=t.get("draft_n_accepted", 0))
    else:
        out["error"] = data[:300].decode(errors="replace")
    return out


def run_load(port: int, prompts: list[tuple[str, str]], clients: int, requests: int, n: int) -> dict:
    """`clients` threads, each sending `requests` requests in a row; client c's k-th request uses
    prompt (c + k) mod len(prompts)."""
    results: dict[tuple[int, int], dict] = {}
    go = threading.Event()

    def client(c: int) -> None:
        go.wait()
        for k in range(requests):
            results[(c, k)] = post_chat(port, prompts[(c + k) % len(prompts)][1], n)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for th in threads:
        th.start()
    t0 = time.perf_counter()
    go.set()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    keys = sorted(results)
    rs = [results[k] for k in keys]
    ok = [r for r in rs if r["status"] == 200]
    lat = [r["latency"] for r in rs]
    tokens = sum(r["tokens"] for r in ok)
    drafted, accepted = sum(r["draft_n"] for r in ok), sum(r["draft_accepted"] for r in ok)
    return {"wall_s": round(wall, 3), "tokens": tokens, "tok_s": round(tokens / wall, 2),
            "p50_s": round(percentile(lat, 50), 3), "p95_s": round(percentile(lat, 95), 3),
            "ok": len(ok), "total": len(rs), "stop": sum(r["finish"] == "stop" for r in ok),
            "drafted": drafted, "accepted": accepted,
            "errors": sorted({f"{r['status']}: {r.get('error', '')[:120]}" for r in rs if r["status"] != 200}),
            "texts": [r["text"] for r in rs]}


class Server:
    """A server subprocess on a free port, its output in a log file; a context manager that stops it."""

    def __init__(self, label: str, cmd: list[str], logdir: Path):
        self.label, self.cmd, self.port = label, cmd, free_port()
        self.cmd = cmd + ["--port", str(self.port)]
        self.log = logdir / (re.sub(r"[^A-Za-z0-9]+", "_", label) + f"_{self.port}.log")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        print(f"[{self.label}] {shlex.join(self.cmd)}", file=sys.stderr)
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.label} exited with {self.proc.returncode} before it was ready: {self.tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.3)
        self.__exit__(None, None, None)
        raise BenchError(f"{self.label} not ready after {START_TIMEOUT:g} s: {self.tail()}")

    def __exit__(self, *exc) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:]) or "(no output)"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def measure(server: Server, prompts, clients: int, requests: int, n: int) -> dict:
    with server:
        warm = post_chat(server.port, "Say hello.", 8)   # untimed: pages the weights in
        if warm["status"] != 200:
            raise BenchError(f"{server.label}: warm-up request failed: {warm['status']} {warm.get('error', '')}")
        load = os.getloadavg()
        r = run_load(server.port, prompts, clients, requests, n)
        r["loadavg_before"] = [round(x, 2) for x in load]
        r["log"] = server.output()
    return r


def compare(a: list, b: list) -> dict:
    """Request-by-request text comparison: identical count, and where the first differences start."""
    diffs = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x is None or y is None or x == y:
            continue
        at = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        diffs.append({"request": i, "char": at, "a": x[max(0, at - 30):at + 30], "b": y[max(0, at - 30):at + 30]})
    both = sum(x is not None and y is not None for x, y in zip(a, b))
    return {"identical": both - len(diffs), "compared": both, "diffs": diffs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--draft", type=Path, help="draft GGUF: adds 'llamaspec draft' and llama-server's draft-simple")
    ap.add_argument("--native-bin", type=Path, help="directory with llama.cpp's llama-server (omitted: llamaspec only)")
    ap.add_argument("--native-spec", action="append", metavar="ARGS",
                    help="llama-server speculative arguments to probe (repeatable; one: no probe)")
    ap.add_argument("--native-args", default="", metavar="ARGS", help="added to every llama-server command")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="requests per client, one after another")
    ap.add_argument("-n", type=int, default=128, help="max_tokens per request")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4, help="server slots")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    for p, what in ((args.model, "MODEL"), (args.draft, "--draft")):
        if p is not None and not p.is_file():
            raise BenchError(f"{what}: no such file: {p}")
    native = None
    if args.native_bin is not None:
        native = args.native_bin / "llama-server"
        if not native.is_file():
            raise BenchError(f"--native-bin: no llama-server in {args.native_bin} (build it: cmake --build build "
                             "--target llama-server)")
    if min(args.clients, args.requests, args.n, args.threads, args.parallel) < 1:
        raise BenchError("--clients, --requests, -n, -t and --parallel must be at least 1")

    prompts = code_prompts()
    model, t, np_ = str(args.model), str(args.threads), args.parallel
    ls = [sys.executable, "-m", "llamaspec", "serve", model, "--parallel", str(np_), "-t", t, "--temp", "0"]
    load = dict(clients=args.clients, requests=args.requests, n=args.n)
    out = {"model": model, "draft": str(args.draft) if args.draft else None, "threads": args.threads,
           "parallel": np_, **load, "prompts": [name for name, _ in prompts],
           "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
           "runs": [], "probe": []}
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
        logdir = Path(tmp)

        def record(server: str, mode: str, cmd: list[str], r: dict, setting: str = "") -> dict:
            row = {"server": server, "mode": mode, "setting": setting, "cmd": shlex.join(cmd), **r}
            rows[f"{server} {mode}"] = row
            out["runs"].append(row)
            print(f"  {server} {mode}: {r['tok_s']} tok/s, p50 {r['p50_s']} s, p95 {r['p95_s']} s, ok {r['ok']}/"
                  f"{r['total']}, load {r['loadavg_before'][0]}", file=sys.stderr)
            return row

        cmd = ls + ["--spec-type", "none"]
        r = measure(Server("llamaspec plain", cmd, logdir), prompts, **load)
        m = re.search(r"(\d+) tokens each", r["log"])
        if not m:
            raise BenchError("llamaspec serve's start-up line did not give its context per slot")
        ctx = int(m.group(1))
        record("llamaspec", "plain", cmd, r, "--spec-type none")
        r = measure(Server("llamaspec spec", ls, logdir), prompts, **load)
        spec = re.search(r"spec ([^,)]+)", r["log"])
        record("llamaspec", "spec", ls, r, f"default ({spec.group(1) if spec else '?'})")
        if args.draft:
            cmd = ls + ["--draft", str(args.draft)]
            r = measure(Server("llamaspec draft", cmd, logdir), prompts, **load)
            record("llamaspec", "draft", cmd, r, "--draft DRAFT")
        if native is not None:
            base = [str(native), "-m", model, "-np", str(np_), "-t", t, "-c", str(np_ * ctx), "--temp", "0",
                    "--no-webui", "-ngl", "0", *shlex.split(args.native_args)]
            r = measure(Server("llama-server plain", base, logdir), prompts, **load)
            record("llama-server", "plain", base, r, args.native_args or "defaults")
            cands = [shlex.split(s) for s in args.native_spec] if args.native_spec else list(NATIVE_CANDIDATES)
            if args.draft and not args.native_spec:
                no_amx = [] if "--no-repack" in base or not cpu_has_amx() else ["--no-repack"]
                cands.append(["--spec-type", "draft-simple", "-md", str(args.draft), *no_amx])
            best = cands[0]
            if len(cands) > 1:
                best_tps = -1.0
                for c in cands:
                    label = shlex.join(c).replace(str(args.draft), "DRAFT") if args.draft else shlex.join(c)
                    try:
                        p = measure(Server(f"probe llama-server {label}", base + c, logdir), prompts,
                                    clients=np_, requests=1, n=args.n)
                    except BenchError as e:   # a type this build refuses for this model: not a candidate
                        print(f"  probe {label}: failed: {e}", file=sys.stderr)
                        out["probe"].append({"setting": label, "error": str(e)})
                        continue
                    p.pop("log"), p.pop("texts")
                    out["probe"].append({"setting": label, **p})
                    print(f"  probe {label}: {p['tok_s']} tok/s, ok {p['ok']}/{p['total']}", file=sys.stderr)
                    if p["ok"] == p["total"] and p["tok_s"] > best_tps:
                        best, best_tps = c, p["tok_s"]
            label = shlex.join(best).replace(str(args.draft), "DRAFT") if args.draft else shlex.join(best)
            cmd = base + best
            r = measure(Server("llama-server spec", cmd, logdir), prompts, **load)
            record("llama-server", "spec", cmd, r, label)
    out["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()

    checks, ratios = {}, {}
    for server in ("llamaspec", "llama-server"):
        plain = rows.get(f"{server} plain")
        for mode in ("spec", "draft"):
            row = rows.get(f"{server} {mode}")
            if plain and row:
                checks[f"{server} {mode} vs plain"] = compare(plain["texts"], row["texts"])
                ratios[f"{server} {mode}/plain"] = round(row["tok_s"] / plain["tok_s"], 3)
    if "llama-server plain" in rows:
        checks["llama-server plain vs llamaspec plain"] = compare(rows["llamaspec plain"]["texts"],
                                                                  rows["llama-server plain"]["texts"])
        for mode in ("plain", "spec", "draft"):
            other = rows["llama-server plain" if mode == "plain" else "llama-server spec"]
            if f"llamaspec {mode}" in rows:
                ratios[f"llamaspec/llama-server {mode}" + ("" if mode != "draft" else " (vs its spec)")] = \
                    round(rows[f"llamaspec {mode}"]["tok_s"] / other["tok_s"], 3)
    out["checks"], out["ratios"] = checks, ratios
    for row in out["runs"]:
        row.pop("log")
        row["texts_sample"] = [(x or "")[:80] for x in row.pop("texts")[:2]]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{args.model.name}: {args.clients} clients x {args.requests} requests, max_tokens {args.n}, "
          f"--parallel {np_}, -t {args.threads}, llamaspec context {ctx}/slot")
    print(f"uptime at start: {out['uptime_start']}")
    print(f"uptime at end:   {out['uptime_end']}")
    if out["probe"]:
        print("llama-server speculative probe (%d clients x 1 request):" % np_)
        for p in out["probe"]:
            print(f"  {p['setting']:<46} " + (f"{p['tok_s']:>7.1f} tok/s  ok {p['ok']}/{p['total']}  "
                                              f"accepted {p['accepted']}/{p['drafted']}" if "tok_s" in p else p["error"]))
    hdr = f"{'server':<13}{'mode':<7}{'tok/s':>8}{'p50 s':>8}{'p95 s':>8}{'ok':>8}{'stop':>6}{'accepted':>14}{'load1':>7}  setting"
    print(hdr)
    print("-" * len(hdr))
    for row in out["runs"]:
        print(f"{row['server']:<13}{row['mode']:<7}{row['tok_s']:>8.1f}{row['p50_s']:>8.2f}{row['p95_s']:>8.2f}"
              f"{str(row['ok']) + '/' + str(row['total']):>8}{row['stop']:>6}"
              f"{str(row['accepted']) + '/' + str(row['drafted']):>14}{row['loadavg_before'][0]:>7.2f}  {row['setting']}")
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    for k, c in checks.items():
        print(f"texts {k}: {c['identical']}/{c['compared']} identical"
              + "".join(f"\n  request {d['request']} differs at char {d['char']}: {d['a']!r} vs {d['b']!r}"
                        for d in c["diffs"][:4]))
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt   # `kill` too stops the server in flight (the with-block's exit)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"bench_serve: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
