#!/usr/bin/env python3
"""Throughput under load: `llamaspec serve` against llama.cpp's llama-server, side by side in one run.

Both servers get the same command line (-c is the context shared by the slots on both since
issue 25; `--parallel` is `-np`):

  llamaspec plain      llamaspec serve MODEL --parallel P -c C -t T --temp 0 --spec-type none
  llamaspec spec       llamaspec serve MODEL --parallel P -c C -t T --temp 0   (its default speculation)
  llamaspec draft      the same with --draft DRAFT                             (only with --draft)
  llama-server plain   llama-server -m MODEL -np P -c C -t T --temp 0 --no-webui -ngl 0
  llama-server spec:X  the same plus each of --spec-type ngram-simple / ngram-mod / ngram-map-k
                       (llama.cpp's default parameters) and, with --draft, draft-simple -md DRAFT;
                       --native-spec "ARGS" (repeatable) replaces them. Every one is measured in
                       every repetition; "best spec" is the one with the highest median tok/s.

Each server runs as a subprocess on a free 127.0.0.1 port; the script waits for /health, sends one
untimed warm-up request, measures, stops it. With --reps N every side runs N times, interleaved
(rep r starts at side r, rotating), and the table gives medians (and each rep's tok/s).

On a CPU with AMX, llama-server puts weights in ggml's AMX buffer by default (F16 ones too), and
with a quantized draft it segfaults in ggml_backend_amx_mul_mat at start-up (llama.cpp issue 20824;
llamaspec never uses that buffer, README "CPUs with AMX"): its draft-simple candidate gets
--no-repack there. --native-args "ARGS" adds arguments to every llama-server run.

Loads (--load): `mixed` (default, issue 25): 16 chat prompts, 6 code edits, 5 extractions from
short documents, 5 pieces of prose, kinds interleaved; 8 clients x 2 requests, each prompt once.
`code`: the bundled code-rewrite prompts, 8 clients x 4 requests. max_tokens 128, temperature 0,
stream false. Throughput = completion tokens of all requests / wall seconds from the first request
to the last answer; p50/p95 of per-request latency. Ratios: each of our modes against llama-server
plain and its best spec type (tok/s, p50, p95). Greedy texts of each speculative mode are compared
request by request with its server's plain mode (and llama-server's plain with llamaspec's plain,
for information). llama-server counts the end-of-generation token in `completion_tokens` when a
request stops early; llamaspec does not (column `stop`).

    python scripts/bench_serve.py MODEL --native-bin DIR [--load mixed] [--reps 5] [--parallel 4]
        [-c 8192] [-t 2] [--draft DRAFT] [--only llamaspec] [--json]
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


def post_chat(port: int, text: str, n: int, temperature: float = 0.0, seed: int | None = None) -> dict:
    req = {"model": "bench", "messages": [{"role": "user", "content": text}], "max_tokens": n,
           "temperature": temperature, "stream": False}
    if seed is not None:
        req["seed"] = seed
    body = json.dumps(req).encode()
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


def run_load(port: int, prompts: list[tuple[str, str]], clients: int, requests: int, n: int, pick=None,
             temperature: float = 0.0, seed: int | None = None) -> dict:
    """`clients` threads, each sending `requests` requests in a row; client c's k-th request uses
    prompt pick(c, k) (default (c + k) mod len(prompts)). Results in (client, request) order.
    temperature and seed go into every request (default greedy, no seed)."""
    pick = pick or (lambda c, k: (c + k) % len(prompts))
    results: dict[tuple[int, int], dict] = {}
    go = threading.Event()

    def client(c: int) -> None:
        go.wait()
        for k in range(requests):
            results[(c, k)] = post_chat(port, prompts[pick(c, k)][1], n, temperature, seed)

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
            "texts": [r["text"] for r in rs], "latencies": [round(r["latency"], 2) for r in rs]}


class Server:
    """A server subprocess on a free port, its output in a log file; a context manager that stops it."""

    def __init__(self, label: str, cmd: list[str], logdir: Path, source: Path | None = None):
        self.label, self.cmd, self.port, self.source = label, cmd, free_port(), source   # source: llamaspec's checkout
        self.cmd = cmd + ["--port", str(self.port)]
        self.log = logdir / (re.sub(r"[^A-Za-z0-9]+", "_", label) + f"_{self.port}.log")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        print(f"[{self.label}] {shlex.join(self.cmd)}", file=sys.stderr)
        with open(self.log, "wb") as f:
            env = None if self.source is None else {**os.environ, "PYTHONPATH": str(self.source)}
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=self.source)
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


# ---- the mixed load: code edits, extraction, prose (issue 25), 16 prompts, kinds interleaved ----------

_SNIPPETS = {
    "py-loop": ("def total_price(items):\n    result = 0\n    for item in items:\n        if item.available:\n"
                "            result = result + item.price * item.quantity\n    return result\n\n\n"
                "def names(items):\n    out = []\n    for item in items:\n        out.append(item.name.strip())\n"
                "    return out\n"),
    "js-fetch": ("function loadUser(id, callback) {\n  fetch('/api/users/' + id)\n    .then(function (r) { return r.json(); })\n"
                 "    .then(function (user) { callback(null, user); })\n    .catch(function (err) { callback(err); });\n}\n\n"
                 "function loadPosts(id, callback) {\n  fetch('/api/users/' + id + '/posts')\n"
                 "    .then(function (r) { return r.json(); })\n    .then(function (posts) { callback(null, posts); })\n"
                 "    .catch(function (err) { callback(err); });\n}\n"),
    "py-config": ("import json\n\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n        self.data = {}\n\n"
                  "    def load(self):\n        with open(self.path) as f:\n            self.data = json.load(f)\n\n"
                  "    def get(self, key, default=None):\n        if key in self.data:\n            return self.data[key]\n"
                  "        return default\n\n    def set(self, key, value):\n        self.data[key] = value\n\n"
                  "    def save(self):\n        with open(self.path, 'w') as f:\n            json.dump(self.data, f)\n"),
    "sql": ("SELECT customers.name, orders.total, orders.created_at\nFROM customers, orders\n"
            "WHERE customers.id = orders.customer_id\n  AND orders.total > 100\n  AND orders.status = 'paid'\n"
            "ORDER BY orders.created_at DESC;\n"),
    "go-err": ("func readConfig(path string) (Config, error) {\n\tdata, err := os.ReadFile(path)\n\tif err != nil {\n"
               "\t\treturn Config{}, err\n\t}\n\tvar c Config\n\terr = json.Unmarshal(data, &c)\n\tif err != nil {\n"
               "\t\treturn Config{}, err\n\t}\n\treturn c, nil\n}\n"),
}
_EDITS = [
    ("py-loop", "Rename `result` to `total` and `out` to `cleaned`, changing nothing else. Output the complete code."),
    ("js-fetch", "Rewrite both functions with async/await instead of callbacks, keeping their names. Output the code."),
    ("py-config", "Add type hints to every method, changing nothing else. Output the complete class."),
    ("sql", "Rewrite the query with an explicit JOIN ... ON instead of the comma join. Output only the query."),
    ("go-err", "Wrap both errors with fmt.Errorf and %w, saying which step failed. Output the complete function."),
]
_DOCS = [
    "Dear team, the quarterly review moves to Thursday 14 March at 10:30 in room B2. Anna Berg (finance) presents "
    "the budget, Luis Ortega (sales) the pipeline, and Mei Chen (engineering) the roadmap. Please send slides to "
    "Anna by Tuesday. Lunch is provided; tell Mei about dietary needs.",
    "Invoice 2024-0193 from Nordlicht GmbH, Hamburg, dated 2 May 2024: 12 desk lamps at 34.50 EUR, 4 office chairs at "
    "189.00 EUR, delivery 25.00 EUR. Payment within 30 days to IBAN DE44 5001 0517 5407 3249 31. VAT 19 % not included.",
    "Patient note: Jonas Weber, 47, seen on 9 June for a persistent cough of three weeks, no fever, non-smoker. "
    "Prescribed a 5-day course of amoxicillin 500 mg three times a day; follow-up in two weeks with Dr. Sara Lind.",
    "Flight update: LX 1832 from Zurich to Lisbon on 21 August, scheduled 07:15, now departs 09:40 from gate A54 "
    "because of a late incoming aircraft. Passengers Kim Novak and Peter Hall are rebooked on seats 14C and 14D.",
    "Release 3.2.0 of the parser library, published 11 November by maintainer Ola Nordmann: adds streaming input, "
    "fixes a crash on empty files (issue 412) and a wrong line number in errors (issue 398), and drops Python 3.8.",
]
_EXTRACT = "Extract every person, organisation, date, place and amount from this text as a JSON object with one key " \
           "per kind, each a list of strings:\n\n"
_PROSE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain to a twelve-year-old how a bicycle's gears make climbing a hill easier.",
    "Write a letter from a retired sailor to his granddaughter about his first storm at sea.",
    "Describe a busy morning market in a coastal town, with its sounds and smells.",
    "Give a friendly explanation of why the sky is blue and sunsets are red.",
]


def mixed_prompts() -> list[tuple[str, str]]:
    """16 prompts: 6 code edits (the bundled module rename and 5 short snippets), 5 extractions
    from short documents, 5 pieces of prose, interleaved so that every client gets a mix."""
    code = [("code-rename", preset_text("code"))]
    code += [(f"edit-{k}", f"Here is some code:\n\n```\n{_SNIPPETS[k]}```\n\n{task}") for k, task in _EDITS]
    extract = [(f"extract-{i}", _EXTRACT + d) for i, d in enumerate(_DOCS)]
    prose = [(f"prose-{i}", t) for i, t in enumerate(_PROSE)]
    out = []
    for i in range(6):
        for group in (code, extract, prose):
            if i < len(group):
                out.append(group[i])
    return out


LOADS = {   # prompts, clients, requests per client, max_tokens, client c's k-th request -> prompt index
    "code": (code_prompts, 8, 4, 128, lambda c, k, clients, n: (c + k) % n),
    "mixed": (mixed_prompts, 8, 2, 128, lambda c, k, clients, n: (k * clients + c) % n),
}


def measure(server: Server, prompts, clients: int, requests: int, n: int, pick=None) -> dict:
    with server:
        warm = post_chat(server.port, "Say hello.", 8)   # untimed: pages the weights in
        if warm["status"] != 200:
            raise BenchError(f"{server.label}: warm-up request failed: {warm['status']} {warm.get('error', '')}")
        load = os.getloadavg()
        r = run_load(server.port, prompts, clients, requests, n, pick)
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


def summarize(runs: list[dict]) -> dict:
    """Medians over the repetitions of one side (and each rep's tok/s, to see the noise)."""
    med = {k: round(statistics.median(r[k] for r in runs), 3) for k in ("tok_s", "p50_s", "p95_s")}
    return {**med, "tok_s_reps": [r["tok_s"] for r in runs], "ok": min(r["ok"] for r in runs),
            "total": runs[0]["total"], "stop": runs[0]["stop"], "drafted": runs[0]["drafted"],
            "accepted": runs[0]["accepted"], "load1": [r["loadavg_before"][0] for r in runs],
            "errors": sorted({e for r in runs for e in r["errors"]}), "texts": runs[0]["texts"],
            "latencies_reps": [r["latencies"] for r in runs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--draft", type=Path, help="draft GGUF: adds 'llamaspec draft' and llama-server's draft-simple")
    ap.add_argument("--native-bin", type=Path, help="directory with llama.cpp's llama-server (omitted: llamaspec only)")
    ap.add_argument("--native-spec", action="append", metavar="ARGS",
                    help="llama-server speculative arguments to measure (repeatable; default: its n-gram types)")
    ap.add_argument("--native-args", default="", metavar="ARGS", help="added to every llama-server command")
    ap.add_argument("--load", choices=sorted(LOADS), default="mixed",
                    help="mixed: code edits, extraction, prose, 8 clients x 2 requests (issue 25); code: the "
                         "bundled code rewrites, 8 x 4")
    ap.add_argument("--clients", type=int, help="default: the load's (8)")
    ap.add_argument("--requests", type=int, help="requests per client, one after another (default: the load's)")
    ap.add_argument("-n", type=int, help="max_tokens per request (default 128)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4, help="server slots (-np)")
    ap.add_argument("-c", "--ctx-size", type=int, default=8192,
                    help="-c given to both servers: the context shared by the slots (default 8192)")
    ap.add_argument("--reps", type=int, default=1, help="repetitions; sides interleaved, order rotating; medians")
    ap.add_argument("--only", choices=["llamaspec", "llama-server"], help="measure one server only")
    ap.add_argument("--compare-to", type=Path, metavar="CHECKOUT",
                    help="also measure llamaspec from another checkout (e.g. `git worktree add /tmp/base HEAD~1`)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    make_prompts, clients, requests, n, pick = LOADS[args.load]
    clients, requests, n = args.clients or clients, args.requests or requests, args.n or n
    for p, what in ((args.model, "MODEL"), (args.draft, "--draft")):
        if p is not None and not p.is_file():
            raise BenchError(f"{what}: no such file: {p}")
    native = None
    if args.native_bin is not None and args.only != "llamaspec":
        native = args.native_bin / "llama-server"
        if not native.is_file():
            raise BenchError(f"--native-bin: no llama-server in {args.native_bin} (build it: cmake --build build "
                             "--target llama-server)")
    if min(clients, requests, n, args.threads, args.parallel, args.ctx_size, args.reps) < 1:
        raise BenchError("--clients, --requests, -n, -t, --parallel, -c and --reps must be at least 1")

    prompts = make_prompts()
    model, t, np_, c = str(args.model), str(args.threads), str(args.parallel), str(args.ctx_size)
    # the same command line on both sides: -np/--parallel and -c mean the same (-c shared by the slots)
    ls = [sys.executable, "-m", "llamaspec", "serve", model, "--parallel", np_, "-c", c, "-t", t, "--temp", "0"]
    sides: list[tuple[str, str, list[str], str]] = []   # server, mode, command, setting
    if args.only != "llama-server":
        for who in ["llamaspec"] + (["llamaspec@" + str(args.compare_to)] if args.compare_to else []):
            sides += [(who, "plain", ls + ["--spec-type", "none"], "--spec-type none"), (who, "spec", ls, "default")]
            if args.draft:
                sides.append((who, "draft", ls + ["--draft", str(args.draft)], "--draft DRAFT"))
    if native is not None:
        base = [str(native), "-m", model, "-np", np_, "-c", c, "-t", t, "--temp", "0", "--no-webui", "-ngl", "0",
                *shlex.split(args.native_args)]
        sides.append(("llama-server", "plain", base, args.native_args or "defaults"))
        cands = [shlex.split(s) for s in args.native_spec] if args.native_spec else list(NATIVE_CANDIDATES)
        if args.draft and not args.native_spec:
            no_amx = [] if "--no-repack" in base or not cpu_has_amx() else ["--no-repack"]
            cands.append(["--spec-type", "draft-simple", "-md", str(args.draft), *no_amx])
        for cand in cands:
            label = shlex.join(cand).replace(str(args.draft), "DRAFT") if args.draft else shlex.join(cand)
            sides.append(("llama-server", f"spec:{label}", base + cand, label))
    load = dict(clients=clients, requests=requests, n=n,
                pick=lambda ci, k: pick(ci, k, clients, len(prompts)))
    out = {"model": model, "draft": str(args.draft) if args.draft else None, "threads": args.threads,
           "parallel": args.parallel, "ctx_size": args.ctx_size, "load": args.load, "clients": clients,
           "requests": requests, "n": n, "reps": args.reps, "prompts": [name for name, _ in prompts],
           "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), "sides": []}
    runs: dict[int, list[dict]] = {i: [] for i in range(len(sides))}
    failed: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
        for rep in range(args.reps):
            order = list(range(len(sides)))
            order = order[rep % len(order):] + order[:rep % len(order)]   # interleaved, rotating
            for i in order:
                server, mode, cmd, setting = sides[i]
                if i in failed:
                    continue
                try:
                    source = args.compare_to if server.startswith("llamaspec@") else None
                    r = measure(Server(f"{server} {mode}", cmd, Path(tmp), source), prompts, **load)
                except BenchError as e:   # e.g. a spec type this build refuses for this model
                    print(f"  {server} {mode}: failed: {e}", file=sys.stderr)
                    failed[i] = str(e)
                    continue
                if server.startswith("llamaspec") and (m := re.search(r"\(context [^)]*spec ([^,)]+)", r["log"])):
                    out.setdefault("llamaspec_startup", re.search(r"serving .*", r["log"])[0])
                    sides[i] = (server, mode, cmd, m.group(1) if mode == "spec" else setting)
                r.pop("log")
                runs[i].append(r)
                print(f"  rep {rep + 1} {server} {mode}: {r['tok_s']} tok/s, p50 {r['p50_s']} s, p95 {r['p95_s']} s, "
                      f"ok {r['ok']}/{r['total']}, load {r['loadavg_before'][0]}", file=sys.stderr)
    out["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rows = {}
    for i, (server, mode, cmd, setting) in enumerate(sides):
        if runs[i]:
            rows[(server, mode)] = {"server": server, "mode": mode, "setting": setting, "cmd": shlex.join(cmd),
                                    **summarize(runs[i])}
        elif i in failed:
            out["sides"].append({"server": server, "mode": mode, "setting": setting, "error": failed[i]})
    native_specs = [k for k in rows if k[0] == "llama-server" and k[1].startswith("spec:")]
    best = max(native_specs, key=lambda k: rows[k]["tok_s"], default=None)
    ratios, checks = {}, {}
    ref_plain, ref_spec = rows.get(("llama-server", "plain")), rows.get(best) if best else None
    for mode in ("plain", "spec", "draft"):
        ours = rows.get(("llamaspec", mode))
        for ref, name in ((ref_plain, "llama-server plain"), (ref_spec, "llama-server best spec")):
            if ours and ref:
                ratios[f"llamaspec {mode} / {name}"] = {
                    "tok_s": round(ours["tok_s"] / ref["tok_s"], 3), "p50": round(ours["p50_s"] / ref["p50_s"], 3),
                    "p95": round(ours["p95_s"] / ref["p95_s"], 3)}
    base = "llamaspec@" + str(args.compare_to) if args.compare_to else None
    for mode in ("plain", "spec", "draft"):
        ours, old = rows.get(("llamaspec", mode)), rows.get((base, mode))
        if ours and old:
            ratios[f"llamaspec {mode} / {base} {mode}"] = {
                "tok_s": round(ours["tok_s"] / old["tok_s"], 3), "p50": round(ours["p50_s"] / old["p50_s"], 3),
                "p95": round(ours["p95_s"] / old["p95_s"], 3)}
            checks[f"{base} {mode} vs llamaspec {mode}"] = compare(old["texts"], ours["texts"])
    if ref_plain and ref_spec:
        ratios["llama-server best spec / llama-server plain"] = {"tok_s": round(ref_spec["tok_s"] / ref_plain["tok_s"], 3)}
    for server in ("llamaspec", "llama-server"):
        plain = rows.get((server, "plain"))
        for (s, mode), row in rows.items():
            if s == server and mode != "plain" and plain:
                checks[f"{server} {mode} vs plain"] = compare(plain["texts"], row["texts"])
    if ("llamaspec", "plain") in rows and ref_plain:
        checks["llama-server plain vs llamaspec plain"] = compare(rows[("llamaspec", "plain")]["texts"], ref_plain["texts"])
    out["best_native_spec"] = rows[best]["setting"] if best else None
    out["ratios"], out["checks"] = ratios, checks
    for row in rows.values():
        row["texts_sample"] = [(x or "")[:80] for x in row.pop("texts")[:2]]
        out["sides"].append(row)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{args.model.name}: load {args.load}, {clients} clients x {requests} requests, max_tokens {n}, "
          f"both servers --parallel/-np {np_} -c {c} -t {t}, {args.reps} rep(s), medians")
    if "llamaspec_startup" in out:
        print(f"llamaspec: {out['llamaspec_startup']}")
    print(f"uptime at start: {out['uptime_start']}")
    print(f"uptime at end:   {out['uptime_end']}")
    hdr = (f"{'server':<13}{'mode':<26}{'tok/s':>8}{'p50 s':>8}{'p95 s':>8}{'ok':>7}{'stop':>5}{'accepted':>11}"
           f"  tok/s per rep")
    print(hdr)
    print("-" * len(hdr))
    for row in out["sides"]:
        if "error" in row:
            print(f"{row['server']:<13}{row['mode']:<26} failed: {row['error'][:100]}")
            continue
        mode = row["mode"].replace("--spec-type ", "") if row["mode"] != "spec" else f"spec {row['setting']}"
        print(f"{row['server']:<13}{mode[:25]:<26}{row['tok_s']:>8.1f}{row['p50_s']:>8.2f}{row['p95_s']:>8.2f}"
              f"{str(row['ok']) + '/' + str(row['total']):>7}{row['stop']:>5}"
              f"{str(row['accepted']) + '/' + str(row['drafted']):>11}  "
              + " ".join(f"{x:.1f}" for x in row["tok_s_reps"]))
    for k, v in ratios.items():
        print(f"{k}: " + ", ".join(f"{m} {x:.2f}x" for m, x in v.items()))
    for k, ch in checks.items():
        print(f"texts {k}: {ch['identical']}/{ch['compared']} identical"
              + "".join(f"\n  request {d['request']} differs at char {d['char']}: {d['a']!r} vs {d['b']!r}"
                        for d in ch["diffs"][:4]))
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt   # `kill` too stops the server in flight (the with-block's exit)


def run_script(main, name: str) -> None:
    """Run a server benchmark's main: SIGTERM stops it like Ctrl-C (servers in flight are stopped
    by their with-blocks), a BenchError is one line and exit 2, an interrupt exit 130."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"{name}: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    run_script(main, "bench_serve")
