"""`llamaspec batch --ray`: the same job run by Ray actors, one Generator each; and a Ray Data
`map_batches` class (`GeneratorPredictor`). Needs the optional extra `llamaspec[ray]`.

The driver (the `batch` command) stays the only writer of OUTPUT: it keeps the lock, the
manifest and the resume; this module only turns requests into `Result`s on the cluster:

    with RayExecutor(model, options, workers=2) as ex:     # actors load the models once
        for res in ex.generate_many(requests, parallel=4): # Results as their chunks finish
            ...

Requests are sharded by a stable hash of their id (crc32, the same on every run and machine),
sent to each actor a few at a time (a chunk of 2 x parallel, two chunks queued per actor so it
never waits for the driver), and each chunk's Results come back as soon as it is done: a worker
that dies loses only its unfinished chunks, whose requests go to the surviving actors (or to a
fresh actor when none survives). Models reach the workers by what `model` names: a path (made
absolute here when it exists on the driver; it must exist on every node) or a Hub reference
(each node downloads into its own cache).

Not in llamaspec.batch's __init__: the rest of batch/ is plain Python, this module is the API
layer's (Generator) on Ray, imported only when asked for.
"""

from __future__ import annotations

import logging
import os
import socket
import zlib
from collections import deque
from contextlib import suppress
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from llamaspec import errors
from llamaspec.errors import LlamaspecError, UsageError

if TYPE_CHECKING:
    from llamaspec.api.options import GenerationOptions
    from llamaspec.api.generator import Request, Result

__all__ = ["require_ray", "connect", "probe", "shard_of", "RayExecutor", "GeneratorPredictor", "EXTRA_MESSAGE"]

EXTRA_MESSAGE = "--ray needs the optional extra 'ray': pip install 'llamaspec[ray]'"
PROBE_SECONDS = 3.0   # Ray itself retries a dead address for minutes: a plain TCP connect first
QUEUED_CHUNKS = 2     # per actor: one running, one waiting, so an actor never idles on the driver


def require_ray():
    """The ray module, or UsageError (one line naming the extra) when it is not installed."""
    try:
        import ray
    except ImportError:
        raise UsageError(EXTRA_MESSAGE) from None
    return ray


def shard_of(request_id: str, n: int) -> int:
    """The worker (0..n-1) of an id: crc32, stable across runs, processes and machines (unlike
    hash(), which Python salts per process)."""
    return zlib.crc32(request_id.encode("utf-8")) % n


def _bootstrap_address(address: str | None) -> str | None:
    """host:port that `ray.init(address)` will dial, or None when none is dialled (`local`, or
    Ray starts a new local cluster when none runs: address None without RAY_ADDRESS)."""
    if address == "local":
        return None
    if address is None:
        address = os.environ.get("RAY_ADDRESS") or "auto"
    if address.startswith("ray://"):
        return address[len("ray://"):].split("/")[0]
    try:   # "auto": RAY_ADDRESS, else the cluster `ray start` left on this machine
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError:   # a Ray without it: let ray.init decide (no probe)
        return None if address == "auto" else address
    return canonicalize_bootstrap_address_or_die(address)


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS


def probe(host: str, port: int, timeout: float = PROBE_SECONDS) -> None:
    """Raise ConnectionError unless a gRPC server answers at host:port. Ray's GCS and its client
    server speak gRPC, so the answer to HTTP/2's client preface is a SETTINGS frame (9-byte header,
    type 4). A TCP connect alone is not enough: ray.init on a port where something else listens
    (a web server, a silent socket) waits for minutes."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(_H2_PREFACE)
        head = b""
        try:
            while len(head) < 9 and (chunk := s.recv(9 - len(head))):
                head += chunk
        except socket.timeout:
            raise ConnectionError(f"no answer within {timeout:g} s: not a Ray cluster") from None
        if not _is_settings_frame(head):
            raise ConnectionError("something else listens there: not a Ray cluster")


def _is_settings_frame(head: bytes) -> bool:
    """An HTTP/2 frame header of type SETTINGS (4) on stream 0.

        >>> _is_settings_frame(bytes([0, 0, 6, 4, 0, 0, 0, 0, 0]))
        True
        >>> _is_settings_frame(b"HTTP/1.1 400 Bad Request")
        False
    """
    return len(head) == 9 and head[3] == 4 and head[5:9] == b"\0\0\0\0"


def connect(address: str | None) -> bool:
    """ray.init on `address` ("auto", host:port, ray://host:port, "local"; None: Ray's default),
    with Ray's own logging held back. A cluster that does not answer is a UsageError of one line
    within PROBE_SECONDS (Ray alone would retry for minutes, logging each attempt). False when
    this process was connected already (the caller then leaves ray.shutdown to its owner)."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    where = address or "auto"
    try:
        target = _bootstrap_address(address)
        if target is not None:
            host, _, port = target.rpartition(":")
            probe(host.strip("[]"), int(port))
        _init_keeping_signals(ray, address)
        return True
    except (ConnectionError, OSError, ValueError, RuntimeError) as e:   # (RuntimeError: Ray's version mismatch)
        why = (str(e).splitlines() or [type(e).__name__])[0].split(". ")[0].rstrip(".")  # Ray's first sentence
        raise UsageError(f"no Ray cluster answers at {where} ({why})",
                         "start one (ray start --head) or give --ray HOST:PORT of a running cluster") from None


def _init_keeping_signals(ray, address: str | None) -> None:
    """ray.init, then the caller's SIGINT/SIGTERM handlers again: Ray's core installs its own
    crash handler for SIGTERM, which would kill the driver mid-record instead of letting the job
    stop as a local one does (what finished kept, the summary, exit 143)."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


class _Worker:
    """One Ray actor: loads a Generator once and runs chunks of requests through the engine."""

    def __init__(self, model: str | None, options: GenerationOptions, tuned: bool = True):
        self.model, self.options, self.tuned, self.g = model, options, tuned, None

    def load(self) -> dict[str, Any]:
        """What the driver's manifest and records need, or {"error": ...}: a LlamaspecError
        travels by name, message and hint (its class is rebuilt on the driver)."""
        from llamaspec.api.generator import Generator

        node = socket.gethostname()
        try:
            self.g = Generator.from_options(self.model, self.options, tuned=self.tuned)
        except LlamaspecError as e:
            return {"error": [type(e).__name__, e.message, e.hint], "node": node}
        r = self.g.resolved
        return {"node": node, "pid": os.getpid(), "target_path": str(r.target_path),
                "target_size": os.path.getsize(r.target_path), "target_ref": str(r.target_ref),
                "draft_path": None if r.draft_path is None else str(r.draft_path),
                "describe": self.g.describe(), "tuned": self.g.tuned, "notes": list(self.g.notes),
                "details": list(r.details)}

    def run(self, requests: list[Request], parallel: int) -> tuple[list[Result], dict[int, bytes]]:
        """The chunk's results, and the bytes of the tokens their logprobs name (the driver
        writes OpenAI's logprobs with them: it has no model)."""
        out, pieces = [], {}
        for res in self.g.generate_many(requests, parallel=parallel):
            if res.error is not None:   # by message only: some LlamaspecErrors do not pickle whole
                res = replace(res, error=LlamaspecError(res.error.message))
            for lp in res.logprobs or ():
                for tok in (lp.token, *(t for t, _ in lp.top)):
                    if tok not in pieces:
                        pieces[tok] = self.g.pipeline.target.piece(tok)
            out.append(res)
        return out, pieces

    def pid(self) -> int:
        return os.getpid()


def _rebuilt(error: list, node: str) -> LlamaspecError:
    name, message, hint = error
    cls = getattr(errors, name, LlamaspecError)
    if not (isinstance(cls, type) and issubclass(cls, LlamaspecError)):
        cls = LlamaspecError
    try:
        return cls(f"on Ray node {node}: {message}", hint)
    except TypeError:   # a subclass with another constructor
        return LlamaspecError(f"on Ray node {node}: {message}", hint)


def _local_path(p: Any) -> Any:
    """An existing local path made absolute (workers start elsewhere); anything else as given."""
    return os.path.abspath(p) if p is not None and os.path.exists(os.fspath(p)) else p


class RayExecutor:
    """Actors on the connected cluster (`connect` first), each holding one Generator built with
    `Generator.from_options(model, options)`. workers None: one actor per node with a CPU; N: N
    actors spread over the nodes. `identity` is the first worker's load report (target path,
    size, ref, describe(), tuned, notes, details); every worker must have loaded the same model size."""

    def __init__(self, model: str | None, options: GenerationOptions, *, workers: int | None = None,
                 tuned: bool = True):
        self.ray = require_ray()
        self.model = None if model is None else str(_local_path(model))
        self.options = replace(options, draft=_local_path(options.draft),
                               search=tuple(_local_path(p) for p in options.search))
        self.tuned = tuned
        self._remote = self.ray.remote(_Worker)
        self.actors: dict[int, Any] = {}
        self.pieces: dict[int, bytes] = {}   # token id -> bytes, of the tokens results' logprobs name
        self._next_slot = 0
        self.replacements = self.max_replacements = 0
        try:
            for opts in self._placements(workers):
                self._start(opts)
            reports = self.ray.get([a.load.remote() for a in self.actors.values()])
            for report in reports:
                if "error" in report:
                    raise _rebuilt(report["error"], report["node"])
            sizes = {(r["target_size"], r["node"]) for r in reports}
            if len({s for s, _ in sizes}) > 1:
                raise UsageError("the Ray nodes loaded different models: "
                                 + ", ".join(f"{n}: {s} bytes" for s, n in sorted(sizes)),
                                 "give the same file on every node (or a Hub reference)")
            self.identity = reports[0]
            self.max_replacements = len(self.actors)
        except BaseException:
            self.close()
            raise

    def piece(self, tok: int) -> bytes:
        """A token's bytes, for the logprobs of the results delivered so far."""
        return self.pieces[tok]

    def _placements(self, workers: int | None) -> list[dict]:
        """Actor options: one per alive node with a CPU (pinned there), or `workers` spread out,
        each reserving a CPU (a share of one when there are fewer CPUs than workers: an actor
        that cannot be placed would wait forever)."""
        ray = self.ray
        if workers is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]
            if not nodes:
                raise UsageError("the Ray cluster has no node with a CPU", "add a node, or give --ray-workers N")
            return [{"num_cpus": 1, "scheduling_strategy": NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)}
                    for n in nodes]
        cpus = ray.cluster_resources().get("CPU", 0)
        share = min(1.0, cpus / workers) if cpus else 0
        return [{"num_cpus": share, "scheduling_strategy": "SPREAD"} for _ in range(workers)]

    def _start(self, opts: dict) -> int:
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        self.actors[slot] = self._remote.options(**opts).remote(self.model, self.options, self.tuned)
        return slot

    def generate_many(self, requests: Iterable[Request], *, parallel: int = 1,
                      chunk: int | None = None) -> Iterator[Result]:
        """Results of every request exactly once, as each chunk finishes (not in input order).
        A dead actor's unfinished requests are resharded over the live ones; when none is left a
        new actor is started (at most as many times as there were workers), else LlamaspecError."""
        ray = self.ray
        size = chunk or 2 * parallel
        todo = [r for r in requests]
        slots = sorted(self.actors)
        pending: dict[int, deque] = {s: deque() for s in slots}
        for r in todo:
            pending[slots[shard_of(str(r.id), len(slots))]].append(r)
        inflight: dict[Any, tuple[int, list]] = {}
        delivered: set[str] = set()

        def feed(slot: int) -> None:
            queued = sum(1 for s, _ in inflight.values() if s == slot)
            while queued < QUEUED_CHUNKS and pending[slot]:
                part = [pending[slot].popleft() for _ in range(min(size, len(pending[slot])))]
                inflight[self.actors[slot].run.remote(part, parallel)] = (slot, part)
                queued += 1

        for s in slots:
            feed(s)
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1)
            slot, part = inflight.pop(ready[0])
            try:
                results, pieces = ray.get(ready[0])
                self.pieces.update(pieces)
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError):
                # the actor (or its node) died, or its result went with its node: redo the chunk
                # elsewhere, and take this actor out (were it alive, it would compete for the CPU)
                with suppress(Exception):
                    ray.kill(self.actors[slot])
                for s in self._reschedule(slot, part, pending, inflight):
                    feed(s)
                continue
            for res in results:
                if res.id not in delivered:   # (a chunk is delivered once; this is a guard)
                    delivered.add(res.id)
                    yield res
            feed(slot)

    def _reschedule(self, dead: int, part: list, pending: dict, inflight: dict) -> list[int]:
        """Take the dead actor's queue and unfinished chunks; reshard them over the live actors
        (or a new one). Returns the slots to feed."""
        lost = list(part) + list(pending.pop(dead))
        for ref, (s, p) in list(inflight.items()):
            if s == dead:
                del inflight[ref]
                lost.extend(p)
        self.actors.pop(dead, None)
        live = sorted(pending)
        if not live:
            if self.replacements >= self.max_replacements:
                raise LlamaspecError(f"every Ray worker died; {len(lost)} requests not done",
                                     "run the same command again: it resumes after the records written")
            self.replacements += 1
            slot = self._start({"num_cpus": 0})
            report = self.ray.get(self.actors[slot].load.remote())
            if "error" in report:
                raise _rebuilt(report["error"], report["node"])
            pending[slot] = deque()
            live = [slot]
        for r in lost:
            pending[live[shard_of(str(r.id), len(live))]].append(r)
        return live

    def worker_pids(self) -> dict[int, int]:
        """slot -> the actor's process id (tests kill one)."""
        return dict(zip(self.actors, self.ray.get([a.pid.remote() for a in self.actors.values()])))

    def close(self) -> None:
        """Kill the actors (idempotent); the connection stays for the caller to shut down."""
        for a in self.actors.values():
            with suppress(Exception):   # already dead, or the cluster is gone
                self.ray.kill(a)
        self.actors.clear()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GeneratorPredictor:
    """A Ray Data `map_batches` class: each actor of the pool loads one Generator (keyword
    arguments as `Generator(model, ...)`), then maps {"prompt": [...]} batches to the same
    columns plus "text", "finish_reason", "n_generated" and "error" (None, or why that row
    could not run), row for row:

        ds = ray.data.read_json("prompts.jsonl")
        out = ds.map_batches(GeneratorPredictor, fn_constructor_kwargs={"model": "/shared/m.gguf",
                             "temperature": 0, "max_tokens": 64, "parallel": 4},
                             batch_size=16, concurrency=2, batch_format="numpy")
    """

    def __init__(self, model: str | None = None, **generator_kwargs: Any):
        from llamaspec.api.generator import Generator

        self.g = Generator(model, **generator_kwargs)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        from llamaspec.api.generator import Request

        prompts = [str(p) for p in batch["prompt"]]
        got = {r.id: r for r in self.g.generate_many([Request(p, id=str(i)) for i, p in enumerate(prompts)])}
        rows = [got[str(i)] for i in range(len(prompts))]
        return {**{k: list(v) for k, v in batch.items()},
                "text": [r.text for r in rows], "finish_reason": [r.finish_reason for r in rows],
                "n_generated": [len(r.tokens) for r in rows],
                "error": [None if r.error is None else r.error.message for r in rows]}
