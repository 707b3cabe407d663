"""`llamaspec batch --ray`: the same job on a (local, two-node) Ray cluster, the driver the only
writer of OUTPUT. Every id once and the local run's greedy text; a worker killed mid-job and a
driver SIGKILLed and rerun lose and duplicate nothing; no extra / no cluster: a short error."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from child_process import default_signals

HANG_GUARD_S = 120   # a hang guard, not a speed bound (a Ray start on a busy machine)

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [f"Write about topic number {i}: rivers, stones and {i} birds." for i in range(24)]
COMMON = ["--temp", "0", "-n", "48", "-t", "1", "--parallel", "2", "-q"]


def _write_input(path: Path, n: int = len(PROMPTS)) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS[:n])))
    return path


def _records(path: Path) -> dict[str, dict]:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)), "an id was written twice"
    return dict(zip(ids, recs))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _driver(args: list, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llamaspec", "batch", *map(str, args)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals,
                            **kw)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _wait_for_lines(p: subprocess.Popen, path: Path, n: int) -> None:
    deadline = time.monotonic() + 2 * HANG_GUARD_S   # two Ray workers starting on a busy machine
    while p.poll() is None and _lines(path) < n and time.monotonic() < deadline:
        time.sleep(0.02)


def _worker_pids() -> list[int]:
    """Processes of our Ray actors (Ray titles them "ray::_Worker..." ), found through /proc."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes().startswith(b"ray::_Worker"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two nodes of one CPU each on this machine; the workers get an empty tune store (the env
    they inherit is the one at start: conftest's per-test store would not reach them)."""
    from ray.cluster_utils import Cluster

    saved = os.environ.get("LLAMASPEC_CONFIG_DIR")
    os.environ["LLAMASPEC_CONFIG_DIR"] = str(tmp_path_factory.mktemp("ray-config"))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    try:
        yield c.address
    finally:
        ray.shutdown()
        c.shutdown()
        if saved is None:
            os.environ.pop("LLAMASPEC_CONFIG_DIR", None)
        else:
            os.environ["LLAMASPEC_CONFIG_DIR"] = saved


@pytest.fixture(scope="module")
def local_reference(tiny_models, tmp_path_factory):
    """The local job's records (no Ray), for the texts every Ray run must give."""
    d = tmp_path_factory.mktemp("ray-ref")
    inp, out = _write_input(d / "in.jsonl"), d / "ref.jsonl"
    p = _driver([tiny_models["target"], inp, "-o", out, "--draft", tiny_models["draft"], *COMMON])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return inp, _records(out)


def _same_texts(got: dict, want: dict) -> None:
    assert set(got) == set(want) == {f"p{i}" for i in range(len(PROMPTS))}
    assert all(got[k]["text"] == want[k]["text"] for k in want)
    assert all("error" not in r for r in got.values())


@pytest.mark.slow
def test_ray_job_gives_every_id_once_and_the_local_text(cluster, tiny_models, local_reference, tmp_path):
    inp, want = local_reference
    out = tmp_path / "out.jsonl"
    # --fixed-draft: tiny models cost about the same a step, so the controller would rightly pause
    # the draft at once; here the draft must run on the workers (the texts stay the local ones)
    p = _driver([tiny_models["target"], inp, "-o", out, "--draft", tiny_models["draft"], "--fixed-draft",
                 *COMMON[:-1], "--ray", cluster])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert "ray: 2 workers" in err
    got = _records(out)
    _same_texts(got, want)
    assert sum(r["drafted"] for r in got.values()) > 0   # the draft ran on the workers
    manifest = json.loads(Path(str(out) + ".llamaspec.json").read_text())
    assert manifest["settings"]["model"] == str(Path(tiny_models["target"]).absolute())   # as given, not resolved
    # a local rerun of the same job sees it finished: the manifest is the local job's
    p = _driver([tiny_models["target"], inp, "-o", out, "--draft", tiny_models["draft"], "--fixed-draft", *COMMON])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert _records(out).keys() == got.keys()


@pytest.mark.slow
def test_a_worker_killed_mid_job_loses_nothing(cluster, tiny_models, local_reference, tmp_path):
    inp, want = local_reference
    out = tmp_path / "out.jsonl"
    p = _driver([tiny_models["target"], inp, "-o", out, "--draft", tiny_models["draft"], *COMMON,
                 "--ray", cluster, "--ray-workers", "2"])
    _wait_for_lines(p, out, 4)
    pids = _worker_pids()
    assert p.poll() is None and len(pids) == 2, "the job must be running on two workers to kill one"
    os.kill(pids[0], signal.SIGKILL)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    _same_texts(_records(out), want)


@pytest.mark.slow
def test_a_terminated_or_killed_driver_resumes(cluster, tiny_models, local_reference, tmp_path):
    """SIGTERM: Ray's own crash handler must not take it (exit 143 with the summary, as a local
    job); then SIGKILL; then the rerun finishes the job, every id once."""
    inp, want = local_reference
    out = tmp_path / "out.jsonl"
    args = [tiny_models["target"], inp, "-o", out, "--draft", tiny_models["draft"], *COMMON, "--ray", cluster]
    p = _driver([*args, "--json"])
    _wait_for_lines(p, out, 2)
    assert p.poll() is None, "the driver must be stopped mid-job for this test to mean anything"
    p.send_signal(signal.SIGTERM)
    stdout, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    summary = json.loads(stdout)
    assert summary["interrupted"] and summary["done"] == _lines(out) < len(PROMPTS)
    p = _driver(args)
    _wait_for_lines(p, out, summary["done"] + 3)
    assert p.poll() is None, "the driver must be killed mid-job for this test to mean anything"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    assert summary["done"] + 3 <= _lines(out) < len(PROMPTS)
    p = _driver(args)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    _same_texts(_records(out), want)


@pytest.mark.slow
def test_a_model_missing_on_the_workers_is_named_with_its_node(cluster, tmp_path):
    inp, out = _write_input(tmp_path / "in.jsonl", 2), tmp_path / "out.jsonl"
    p = _driver([tmp_path / "nowhere.gguf", inp, "-o", out, "-t", "1", "--ray", cluster])
    _, err = p.communicate(timeout=300)
    assert p.returncode != 0 and "on Ray node" in err and "nowhere.gguf" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]   # no OUTPUT, lock or manifest


def test_ray_without_the_extra_is_one_line(tiny_models, tmp_path):
    inp, out = _write_input(tmp_path / "in.jsonl", 2), tmp_path / "out.jsonl"
    code = ("import sys; sys.modules['ray'] = None; from llamaspec.cli import main; "
            f"main(['batch', {str(tiny_models['target'])!r}, {str(inp)!r}, '-o', {str(out)!r}, '--ray', 'auto'])")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "llamaspec[ray]" in r.stderr, r.stderr
    assert not out.exists()


def test_a_dead_address_is_a_short_error_and_nothing_is_written(tiny_models, tmp_path):
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inp, out = _write_input(tmp_path / "in.jsonl", 2), tmp_path / "out.jsonl"
    r = subprocess.run([sys.executable, "-m", "llamaspec", "batch", str(tiny_models["target"]), str(inp), "-o", str(out),
                        "--ray", f"127.0.0.1:{port}"], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert 1 <= len(r.stderr.strip().splitlines()) <= 4 and f"127.0.0.1:{port}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]   # no OUTPUT, lock or manifest


@pytest.mark.parametrize("answer", [None, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"],
                         ids=["silent", "http1"])
def test_an_address_where_something_else_listens_is_a_short_error(tiny_models, tmp_path, answer):
    """A TCP connect succeeds there, so only a protocol probe keeps ray.init from waiting minutes."""
    import threading

    srv = socket.create_server(("", 0))   # every interface: Ray dials 127.0.0.1 as the node's own IP
    port = srv.getsockname()[1]
    held = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            if answer is not None:
                conn.recv(64)
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    inp, out = _write_input(tmp_path / "in.jsonl", 2), tmp_path / "out.jsonl"
    try:
        r = subprocess.run([sys.executable, "-m", "llamaspec", "batch", str(tiny_models["target"]), str(inp),
                            "-o", str(out), "--ray", f"127.0.0.1:{port}"],
                           env=_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    finally:
        srv.close()
        for c in held:
            c.close()
    assert r.returncode == 2, r.stderr
    assert 1 <= len(r.stderr.strip().splitlines()) <= 4 and "not a Ray cluster" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_the_probe_recognises_a_real_cluster(cluster):
    from llamaspec.batch import ray_executor

    host, _, port = cluster.rpartition(":")
    ray_executor.probe(host, int(port))   # raises ConnectionError if the GCS were not recognised
    assert ray_executor._is_settings_frame(bytes([0, 0, 6, 4, 0, 0, 0, 0, 0]))
    assert not ray_executor._is_settings_frame(b"HTTP/1.1 400 Bad Request")


def test_ray_workers_needs_ray(run_cli, tiny_models, tmp_path):
    inp, out = _write_input(tmp_path / "in.jsonl", 2), tmp_path / "out.jsonl"
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, "--ray-workers", "2")
    assert r.exit_code == 2 and "--ray-workers needs --ray" in r.stderr and not out.exists()


def test_shards_are_stable_and_spread():
    from llamaspec.batch.ray_executor import shard_of

    got = [shard_of(f"p{i}", 3) for i in range(300)]
    assert got == [shard_of(f"p{i}", 3) for i in range(300)]   # crc32: the same in every process
    assert all(60 < got.count(k) < 140 for k in range(3))


def test_generator_predictor_maps_a_batch_row_for_row(tiny_models):
    """The Ray Data map_batches class, called as Ray Data calls it: a dict of columns in, out."""
    from llamaspec import Generator
    from llamaspec.batch.ray_executor import GeneratorPredictor

    kw = {"temperature": 0, "max_tokens": 16, "threads": 1, "parallel": 2, "ctx_size": 256}
    pred = GeneratorPredictor(str(tiny_models["target"]), **kw)
    prompts = PROMPTS[:3] + ["word " * 600]   # the last is too long for a 256 context: an error row
    out = pred({"prompt": prompts, "n": [0, 1, 2, 3]})
    with Generator(tiny_models["target"], **kw) as g:
        want = [g.generate(p).text for p in prompts[:3]]
    assert out["n"] == [0, 1, 2, 3] and out["prompt"] == prompts
    assert out["text"][:3] == want and out["error"][:3] == [None] * 3
    assert out["error"][3] and "context" in out["error"][3]
    assert all(n > 0 for n in out["n_generated"][:3])


@pytest.mark.slow
def test_openai_logprobs_name_their_tokens_on_ray_as_locally(cluster, tiny_models, tmp_path):
    """The driver has no model: the workers send the bytes of the tokens their logprobs name."""
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                                       "body": {"prompt": PROMPTS[i], "max_tokens": 6, "logprobs": 2}}) + "\n"
                           for i in range(4)))

    def logprobs(args: list) -> dict:
        out = tmp_path / f"out{len(args)}.jsonl"
        p = _driver([tiny_models["target"], inp, "-o", out, "--temp", "0", "-t", "1", "-q", *args])
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        recs = [json.loads(line) for line in out.read_text().splitlines()]
        return {r["custom_id"]: r["response"]["body"]["choices"][0]["logprobs"] for r in recs}

    local, remote = logprobs([]), logprobs(["--ray", cluster])
    assert set(remote) == {f"c{i}" for i in range(4)}
    for k, lp in local.items():
        assert lp["tokens"] and remote[k]["tokens"] == lp["tokens"]
        assert [list(t) for t in remote[k]["top_logprobs"]] == [list(t) for t in lp["top_logprobs"]]
