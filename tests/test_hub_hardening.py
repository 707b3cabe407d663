"""Hostile Hub names and broken downloads, against the real local Hub (tests/hub_server.py).

Nothing is written or read outside the HF cache, whatever names a reference or the Hub's listing
holds; a wrong size, a truncated body or a body whose sha256 is not the listed LFS sha256 never
leaves a corrupt file in the cache; a full disk (RLIMIT_FSIZE in a child process) keeps the
partial file to resume from and every earlier file intact. Every case ends in one line on stderr,
a non-zero exit code and no traceback: `CASES` counts them per command for the closing note.
"""

from __future__ import annotations

import hashlib
import os
import random
import resource
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hub_server import big_vocab_gguf, hub, hub_env, hub_home  # noqa: F401 - fixtures
from llamaspec import hub as H
from llamaspec.errors import HubError, UsageError
from llamaspec.hub import cache
from llamaspec.hub.refs import bad_path, parse_ref

REPO_ROOT = Path(__file__).resolve().parents[1]
CASES: Counter = Counter()  # command -> hostile cases run through it (printed by the last test)


@pytest.fixture
def deep_home(hub, tmp_path, monkeypatch):
    """The HF cache four levels below tmp_path, so a '../..' escape would land inside tmp_path."""
    home = tmp_path / "a" / "b" / "c" / "hf"
    env = hub_env(hub, home)
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        if v:
            monkeypatch.setenv(k, v)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    env.pop("HF_TOKEN")
    return env


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def only_in_cache(before: set[Path], root: Path, cache_root: Path) -> None:
    """Every file that appeared under `root` is inside the cache."""
    new = files_under(root) - before
    outside = [p for p in new if cache_root not in p.parents]
    assert not outside, outside


def no_corrupt_blob(cache_root: Path) -> None:
    """Every complete blob in the cache is what its name (an LFS sha256 ETag) says it is."""
    for blob in cache_root.rglob("blobs/*"):
        if blob.name.endswith(".incomplete") or len(blob.name) != 64:
            continue
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob


def one_line_failure(r, code: int | tuple, *needles: str) -> None:
    assert r.exit_code in (code if isinstance(code, tuple) else (code,)), (r.exit_code, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") <= 1, r.stderr  # error + hint
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


# ---- names in references ---------------------------------------------------------------------------

HOSTILE_REFS = [  # (reference, exit code, what the error says)
    ("org/main/../../../escape.gguf", 2, "'.', '..' or empty path component"),
    ("org/main/sub//x.gguf", 2, "'.', '..' or empty path component"),
    ("https://huggingface.co/org/main/resolve/main/%2e%2e%2f%2e%2e%2fx.gguf", 2, "'..'"),
    ("https://huggingface.co/org/main/resolve/main/a%00b.gguf", 2, "U+0000"),
    ("https://huggingface.co/org/main/resolve/main/a%0Ab.gguf", 2, "U+000A"),
    ("https://huggingface.co/org/main/resolve/main/%2Fetc%2Fx.gguf", 2, "absolute path"),
    ("https://huggingface.co/org/main/resolve/%2e%2e/x.gguf", 2, "invalid revision"),
    ("hf://org/main/a\u202egguf.exe.gguf", 2, "U+202E"),
    ("hf://org/main/zero\u200bwidth.gguf", 2, "U+200B"),
    ("hf://org/main/\uff0e\uff0e/fw.gguf", 2, "look-alike"),
    ("hf://org/main/a\u2215b.gguf", 2, "look-alike"),
    ("hf://org/main/a\uff0fb.gguf", 2, "look-alike"),
    ("hf://org/main/" + "x" * 300 + ".gguf", 2, "longer than 255 bytes"),
    ("hf://org/main/" + "/".join(["d" * 200] * 6) + "/x.gguf", 2, "longer than 1000 bytes"),
    ("org/main@..:Q8_0", 2, "invalid revision"),
    ("org/main@../../x/y.gguf", 2, "invalid"),
    ("org/../main:Q8_0", (1, 2), "org/../main:Q8_0"),   # not a Hub shape: a local path (pull: exit 2)
    ("/abs/org/main.gguf", (1, 2), "/abs/org/main.gguf"),
    ("org/main/a\\..\\b.gguf", (1, 2), "b.gguf"),     # backslash: a (Windows-style) local path
]


@pytest.mark.parametrize("ref, code, says", HOSTILE_REFS, ids=[f"ref{i}" for i in range(len(HOSTILE_REFS))])
def test_hostile_reference_is_refused_before_any_request(hub, deep_home, tmp_path, run_cli, ref, code, says):
    before = files_under(tmp_path)
    for cmd in (["pull", ref], ["inspect", ref], ["pair", ref, "--no-default-dirs"]):
        hub.reset()
        r = run_cli(*cmd)
        one_line_failure(r, code, says)
        assert hub.count() == 0, cmd
        CASES[cmd[0]] += 1
    only_in_cache(before, tmp_path, Path(deep_home["HF_HUB_CACHE"]))
    assert files_under(tmp_path) == before  # not even the cache was touched


def test_bad_path_accepts_ordinary_names():
    for ok in ("model-Q4_K_M.gguf", "Q8_0/model-Q8_0-00001-of-00003.gguf", "über/模型-Q4_0.gguf", "a.b..c.gguf",
               "refs/pr/3", "v1.0"):
        assert bad_path(ok) is None, ok
    assert parse_ref("org/repo@refs/pr/3/x.gguf").revision == "refs/pr/3"


# ---- names in the Hub's listing --------------------------------------------------------------------

EVIL_NAMES = {
    "../escape-Q4_K_M.gguf": "'..'",
    "sub/../../../../../escape-Q8_0.gguf": "'..'",
    "/abs-Q5_K_M.gguf": "absolute path",
    "nul\x00-Q6_K.gguf": "U+0000",
    "nl\n-Q3_K_M.gguf": "U+000A",
    "back\\slash-Q2_K.gguf": "backslash",
    "\uff0e\uff0e/fw-IQ4_XS.gguf": "look-alike",
    "x" * 300 + "-IQ3_M.gguf": "longer than 255 bytes",
    "bidi\u202e-Q5_0.gguf": "U+202E",
}


@pytest.fixture
def evil_repo(hub, tiny_models):
    files = {name: tiny_models["draft"] for name in EVIL_NAMES}
    files["ok-Q4_0.gguf"] = tiny_models["draft"]
    hub.add_repo("evil/names", files)
    return hub


@pytest.mark.parametrize("name", sorted(EVIL_NAMES))
def test_unsafe_names_in_a_listing_are_refused_and_named(evil_repo, deep_home, tmp_path, run_cli, name):
    quant = name.rsplit("-", 1)[-1][: -len(".gguf")]
    before = files_under(tmp_path)
    for cmd in (["pull", f"evil/names:{quant}"], ["inspect", f"evil/names:{quant}"],
                ["run", f"evil/names:{quant}", "-p", "hi", "-n", "2", "--spec-type", "none"]):
        r = run_cli(*cmd)
        one_line_failure(r, 1, f"no {quant} file in evil/names@main", "unsafe file name", EVIL_NAMES[name])
        assert ascii(name)[:20] in r.stderr  # the bad name, escaped onto one line
        CASES[cmd[0]] += 1
    assert not any("/resolve/" in r.path for r in evil_repo.requests)  # never asked for
    only_in_cache(before, tmp_path, Path(deep_home["HF_HUB_CACHE"]))


def test_safe_files_of_a_hostile_repo_still_download(evil_repo, deep_home, tmp_path):
    before = files_under(tmp_path)
    pulled = H.pull("evil/names")  # no Q4_K_M/Q8_0 survives: the first safe model file
    assert pulled.files == ["ok-Q4_0.gguf"] and pulled.path.is_file()
    only_in_cache(before, tmp_path, Path(deep_home["HF_HUB_CACHE"]))
    assert [e.file for e in cache.list_cached_ggufs()] == ["ok-Q4_0.gguf"]


def test_hostile_commit_id_and_etag_never_become_paths(hub, deep_home, tmp_path, tiny_models, run_cli):
    before = files_under(tmp_path)
    hub.add_repo("evil/commit", {"m-Q4_K_M.gguf": tiny_models["draft"]})
    for sha in ("../../../../escape", "a" * 39 + "/", "A" * 40):
        hub.repos["evil/commit"].bad_commit = sha
        r = run_cli("pull", "evil/commit")
        one_line_failure(r, 1, "invalid commit id for evil/commit")
        CASES["pull"] += 1
    hub.add_repo("evil/etag", {"m-Q4_K_M.gguf": tiny_models["draft"]})
    for etag in ("../../../../../escape", ".hidden", "a/b", "x" * 200):
        hub.tamper("evil/etag", "m-Q4_K_M.gguf", etag=etag)
        r = run_cli("pull", "evil/etag")
        one_line_failure(r, 1, "invalid ETag for m-Q4_K_M.gguf")
        CASES["pull"] += 1
    only_in_cache(before, tmp_path, Path(deep_home["HF_HUB_CACHE"]))
    assert not list(Path(deep_home["HF_HUB_CACHE"]).rglob("blobs/*"))


def test_a_link_planted_in_the_cache_is_not_followed_out(hub, deep_home, tmp_path):
    secret = tmp_path / "secret.gguf"
    secret.write_bytes(b"GGUF not yours")
    snap = Path(deep_home["HF_HUB_CACHE"]) / "models--org--main" / "snapshots" / hub.commits["main"]
    snap.mkdir(parents=True)
    (snap / "main-Q8_0.gguf").symlink_to(secret)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text(hub.commits["main"])
    pulled = H.pull("org/main:Q8_0")  # not a cache hit: downloaded, and the link replaced
    assert not pulled.cached and pulled.path.resolve() != secret.resolve()
    assert pulled.path.resolve().parent.name == "blobs" and secret.read_bytes() == b"GGUF not yours"
    assert H.resolve_model("org/main:Q8_0").resolve() != secret.resolve()


# ---- wrong sizes, truncated bodies, wrong content --------------------------------------------------


def _flip(data: bytes) -> bytes:
    return data[:1000] + bytes(b ^ 0xFF for b in data[1000:1010]) + data[1010:]


TAMPERED = {  # name -> (tamper arguments from the file's bytes, what the error says)
    "truncated": (lambda d: {"serve": d[:-4096]}, "the server sent 499,968 of the 504,064 bytes"),
    "longer": (lambda d: {"serve": d + b"\0" * 4096}, "sent more than the"),
    "corrupt": (lambda d: {"serve": _flip(d)}, "its sha256 is"),
    "empty": (lambda d: {"serve": b""}, "the server sent 0 of the"),
    "listed-size": (lambda d: {"listed_size": len(d) + 7}, "serves"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_bad_body_never_reaches_the_cache_and_the_next_pull_is_clean(hub, deep_home, tiny_models, run_cli, case):
    data = tiny_models["draft"].read_bytes()
    hub.add_repo("bad/body", {"m-Q4_K_M.gguf": data})
    tamper, says = TAMPERED[case]
    hub.tamper("bad/body", "m-Q4_K_M.gguf", **tamper(data))
    root = Path(deep_home["HF_HUB_CACHE"])
    for cmd in (["pull", "bad/body"], ["run", "bad/body", "-p", "hi", "-n", "2", "--spec-type", "none"]):
        r = run_cli(*cmd)
        one_line_failure(r, 1, "m-Q4_K_M.gguf", says)
        assert "again" in r.stderr or "retry" in r.stderr
        CASES[cmd[0]] += 1
        assert not list(root.rglob("snapshots/*/*.gguf")) and not list(root.rglob("blobs/*.incomplete"))
        no_corrupt_blob(root)
    hub.tamper("bad/body", "m-Q4_K_M.gguf")  # the server is fixed: the next pull is clean
    r = run_cli("pull", "bad/body")
    assert r.exit_code == 0, r.stderr
    (path,) = list(root.rglob("snapshots/*/m-Q4_K_M.gguf"))
    assert path.read_bytes() == data
    no_corrupt_blob(root)


def test_a_resumed_download_whose_partial_is_wrong_is_caught_by_the_sha256(hub, deep_home, tiny_models):
    data = tiny_models["draft"].read_bytes()
    hub.add_repo("bad/resume", {"m-Q4_K_M.gguf": data})
    hub.cut("m-Q4_K_M", after=200_000, then_down=True)
    hub.tamper("bad/resume", "m-Q4_K_M.gguf", serve=_flip(data))  # the first bytes were wrong...
    with pytest.raises(HubError, match="interrupted"):
        H.pull("bad/resume")
    (partial,) = list(Path(deep_home["HF_HUB_CACHE"]).rglob("*.incomplete"))
    assert partial.stat().st_size == 200_000
    hub.down = False
    hub.tamper("bad/resume", "m-Q4_K_M.gguf")  # ...the rest right: the resumed file does not check out
    with pytest.raises(HubError, match="its sha256 is .* the partial file was removed") as info:
        H.pull("bad/resume")
    assert "to download it afresh" in info.value.hint and not partial.exists()
    assert H.pull("bad/resume").path.read_bytes() == data
    CASES["pull"] += 2


def test_a_resume_past_the_end_of_a_shrunken_file_starts_afresh(hub, deep_home, tiny_models):
    data = tiny_models["draft"].read_bytes()
    hub.add_repo("bad/shrunk", {"m-Q4_K_M.gguf": data})
    hub.cut("m-Q4_K_M", after=200_000, then_down=True)
    with pytest.raises(HubError, match="interrupted"):
        H.pull("bad/shrunk")
    hub.down = False
    hub.tamper("bad/shrunk", "m-Q4_K_M.gguf", serve=data[:150_000])  # nothing after our 200,000 bytes: 416
    with pytest.raises(HubError, match="the server has only 200,000 of the 504,064 bytes"):
        H.pull("bad/shrunk")
    assert not list(Path(deep_home["HF_HUB_CACHE"]).rglob("*.incomplete"))
    hub.tamper("bad/shrunk", "m-Q4_K_M.gguf")
    assert H.pull("bad/shrunk").path.read_bytes() == data
    CASES["pull"] += 2


def test_a_non_lfs_file_is_checked_by_its_git_blob_id(hub, deep_home):
    """Small files have no LFS sha256: their git blob id (sha1 of 'blob N\\0' + data) is checked."""
    from llamaspec.hub import download, remote

    hub.add_repo("bad/git", {"m-Q4_K_M.gguf": b"GGUF" + b"\1" * 5000})
    listing = remote.list_repo(parse_ref("bad/git"))
    listing.sha256.clear()
    data = b"GGUF" + b"\1" * 5000
    listing.git_oid["m-Q4_K_M.gguf"] = hashlib.sha1(b"blob 5004\0" + data).hexdigest()
    hub.tamper("bad/git", "m-Q4_K_M.gguf", serve=b"GGUF" + b"\2" * 5000)
    with pytest.raises(HubError, match="its git blob id is"):
        download.fetch(listing, ["m-Q4_K_M.gguf"])
    hub.tamper("bad/git", "m-Q4_K_M.gguf")
    (path,), _ = download.fetch(listing, ["m-Q4_K_M.gguf"])
    assert path.read_bytes() == data
    CASES["pull"] += 1


# ---- disk full (RLIMIT_FSIZE in a child) -----------------------------------------------------------


def _limited(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so a write past the limit raises EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return preexec


def _pull_child(env: dict, ref: str, limit: int | None):
    full = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "llamaspec", "pull", ref, "-q"], env=full, capture_output=True,
                          text=True, timeout=120, preexec_fn=_limited(limit) if limit else None)


def test_disk_full_mid_split_keeps_earlier_files_and_resumes(hub, hub_home, tiny_models):
    rnd = random.Random(7)
    parts = [rnd.randbytes(n) for n in (100_000, 300_000, 120_000)]
    hub.add_repo("org/split", {f"s-Q8_0-0000{i + 1}-of-00003.gguf": p for i, p in enumerate(parts)})
    earlier = H.pull("org/draft:Q4_K_M").path  # already in the cache before the failing pull
    earlier_bytes = earlier.read_bytes()
    hub.reset()

    r = _pull_child(hub_home, "org/split:Q8_0", limit=200_000)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") <= 1, r.stderr
    assert "too large for this disk" in r.stderr and "s-Q8_0-00002-of-00003.gguf" in r.stderr and "resume" in r.stderr
    root = Path(hub_home["HF_HUB_CACHE"])
    (partial,) = list(root.rglob("*.incomplete"))
    assert partial.stat().st_size == 200_000
    assert earlier.read_bytes() == earlier_bytes
    no_corrupt_blob(root)

    hub.reset()
    r = _pull_child(hub_home, "org/split:Q8_0", limit=None)
    assert r.returncode == 0, r.stderr
    gets = [g for g in hub.matching("GET") if "/resolve/" in g.path]
    assert [g.path.rsplit("-", 3)[-3] for g in gets] == ["00002", "00003"]  # part 1 was complete: kept
    assert gets[0].range == "bytes=200000-" and gets[0].sent == 100_000
    pulled = H.pull("org/split:Q8_0")
    assert [p.read_bytes() for p in pulled.paths] == parts and earlier.read_bytes() == earlier_bytes
    no_corrupt_blob(root)
    CASES["pull"] += 2
