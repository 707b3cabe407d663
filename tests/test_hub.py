"""Hub references, quant selection, cache, downloads and remote header reads, against a real local Hub.

The server (tests/hub_server.py) speaks the huggingface_hub 2.4 contract on 127.0.0.1 and counts
every request and byte, so "no GET", "resumed" and "read only the header" are asserted, not hoped.
"""

from __future__ import annotations

import errno
import os
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from hub_server import OTHER_TOKEN, TOKEN, big_vocab_gguf, hub, hub_home  # noqa: F401 - fixtures
from llamaspec import hub as H
from llamaspec.cli._errors import explain
from llamaspec.errors import HubError, UsageError
from llamaspec.gguf.header import read_file
from llamaspec.hub import cache, download, remote, select
from llamaspec.hub.refs import HubRef, classify, parse_ref
from llamaspec.gguf.vocab import vocab_from_header


HANG_GUARD_S = 60   # a hang guard, not a speed bound: speed belongs to benchmarks

def hub_error(fn, *args, **kwargs) -> HubError:
    with pytest.raises(HubError) as info:
        fn(*args, **kwargs)
    return info.value


def file_gets(server, name: str) -> list:
    """GETs of a file's bytes (resolve or CDN), not API calls."""
    return [r for r in server.matching("GET") if not r.path.startswith("/api/") and
            (name in r.path or r.path.startswith("/cdn/"))]


# ---- reference grammar (pure) --------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("org/repo", HubRef("org/repo")),
    ("org/repo:q4_k_m", HubRef("org/repo", quant="Q4_K_M")),
    ("Qwen/Qwen2.5-7B-Instruct-GGUF:UD-Q4_K_XL", HubRef("Qwen/Qwen2.5-7B-Instruct-GGUF", quant="UD-Q4_K_XL")),
    ("org/repo/sub/dir/model-Q8_0.gguf", HubRef("org/repo", path="sub/dir/model-Q8_0.gguf")),
    ("org/repo@v2:Q8_0", HubRef("org/repo", "v2", "Q8_0")),
    ("org/repo:Q8_0@v2", HubRef("org/repo", "v2", "Q8_0")),
    ("org/repo@refs/pr/3/x.gguf", HubRef("org/repo", "refs/pr/3", path="x.gguf")),
    ("org/repo@" + "a" * 40, HubRef("org/repo", "a" * 40)),
    ("hf://org/repo:Q8_0", HubRef("org/repo", quant="Q8_0")),
    ("https://huggingface.co/org/repo/blob/main/m-Q8_0.gguf", HubRef("org/repo", "main", path="m-Q8_0.gguf")),
    # local shapes: never a Hub reference
    ("models/model.gguf", None), ("./org/repo", None), ("/abs/org/repo", None), ("~/m.gguf", None),
    ("model.gguf", None), ("a/b/c/not-a-gguf", None), ("C:\\models\\x.gguf", None),
])
def test_parse_ref(text, expected):
    assert parse_ref(text) == expected


def test_parse_ref_rejects_malformed_hub_refs():
    for bad in ("org/re--po:Q8_0", "org/repo@a:Q8_0@b", "hf://org/repo/README.md", "hf://nonsense"):
        with pytest.raises(UsageError):
            parse_ref(bad)


def test_ref_round_trip():
    for text in ("org/repo", "org/repo:Q8_0", "org/repo@v2:Q8_0", "org/repo@v2/a/b.gguf"):
        assert str(parse_ref(text)) == text


def test_existing_local_path_wins(tmp_path, monkeypatch):
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "repo").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    assert classify("org/repo") == Path("org/repo")
    assert classify("org/other") == HubRef("org/other")


# ---- quant selection (pure; llama.cpp's -hf rules) -----------------------------------------------

FILES = [
    "README.md", "mmproj-model-F16.gguf", "model-BF16.gguf", "model-IQ4_NL.gguf", "model-Q4_K_S.gguf",
    "model-Q8_0.gguf", "imatrix.gguf", "mtp-model-Q8_0.gguf",
    "big/model-Q4_K_M-00001-of-00002.gguf", "big/model-Q4_K_M-00002-of-00002.gguf",
]


def test_default_quant_prefers_q4_k_m_then_q8_0_then_first():
    assert select.choose(FILES, None, None, "r") == ["big/model-Q4_K_M-00001-of-00002.gguf",
                                                     "big/model-Q4_K_M-00002-of-00002.gguf"]
    no_q4 = [f for f in FILES if "Q4_K_M" not in f]
    assert select.choose(no_q4, None, None, "r") == ["model-Q8_0.gguf"]
    only_odd = ["b-Q5_K_M.gguf", "a-Q6_K.gguf", "mmproj-F16.gguf"]
    assert select.choose(only_odd, None, None, "r") == ["b-Q5_K_M.gguf"]  # listing order, side files skipped


def test_quant_match_is_case_insensitive_and_word_bounded():
    assert select.find_model(FILES, "q8_0") == "model-Q8_0.gguf"  # not the mtp- sidecar
    assert select.find_model(FILES, "F16") is None                # BF16 and mmproj F16 do not count
    assert select.find_model(FILES, "BF16") == "model-BF16.gguf"
    assert select.find_model(FILES, "Q4_NL") is None              # not IQ4_NL
    assert select.find_model(FILES, "Q4_K") is None               # a prefix of Q4_K_S is not a match


def test_unknown_quant_lists_available():
    err = hub_error(select.choose, FILES, "Q3_K_M", None, "org/x@main")
    assert err.message == "no Q3_K_M file in org/x@main"
    assert err.hint == "available quants: BF16, IQ4_NL, Q4_K_S, Q8_0, Q4_K_M"


def test_named_later_shard_loads_from_the_first():
    assert select.choose(FILES, None, "big/model-Q4_K_M-00002-of-00002.gguf", "r")[0] == \
        "big/model-Q4_K_M-00001-of-00002.gguf"


def test_incomplete_split_is_an_error():
    err = hub_error(select.choose, ["m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf"], "Q8_0", None, "r")
    assert "part(s) 2 of 3 missing" in err.message


# ---- pull: download, cache hit, interop with huggingface_hub -------------------------------------


def test_pull_downloads_into_the_hf_cache_and_second_pull_makes_no_request(hub, hub_home, tiny_models):
    pulled = H.pull("org/main:q8_0")
    root = Path(hub_home["HF_HUB_CACHE"])
    expected = root / "models--org--main" / "snapshots" / hub.commits["main"] / "main-Q8_0.gguf"
    assert pulled.path == expected and expected.is_file()
    assert expected.read_bytes() == tiny_models["target"].read_bytes() + b"\0" * 64
    assert pulled.downloaded == pulled.size == expected.stat().st_size and not pulled.cached
    assert (root / "models--org--main" / "refs" / "main").read_text() == hub.commits["main"]
    assert len(file_gets(hub, "main-Q8_0")) == 1

    hub.reset()
    again = H.pull("org/main:Q8_0")
    assert again.cached and again.path == expected and again.downloaded == 0
    assert hub.count() == 0  # no GET, no HEAD, no API call

    # --update asks the Hub for the commit (one API call) but downloads nothing
    updated = H.pull("org/main:Q8_0", update=True)
    assert updated.path == expected and updated.downloaded == 0
    assert hub.count("GET", "/api/models/") == 1 and file_gets(hub, "main-Q8_0") == []


def test_cache_is_shared_with_huggingface_hub(hub, hub_home):
    from huggingface_hub import hf_hub_download, scan_cache_dir, try_to_load_from_cache

    pulled = H.pull("org/main:Q8_0")
    root = hub_home["HF_HUB_CACHE"]
    assert try_to_load_from_cache("org/main", "main-Q8_0.gguf", cache_dir=root) == str(pulled.path)
    hub.reset()
    same = hf_hub_download("org/main", "main-Q8_0.gguf", revision=pulled.commit, cache_dir=root,
                           endpoint=hub.url)
    assert same == str(pulled.path) and hub.count() == 0
    info = scan_cache_dir(root)
    assert not info.warnings and {r.repo_id for r in info.repos} == {"org/main"}

    # ...and the other way round: a file `hf download` fetched is a cache hit for us, no network
    theirs = hf_hub_download("org/draft", "draft-Q4_K_M.gguf", cache_dir=root, endpoint=hub.url)
    hub.reset()
    assert H.resolve_model("org/draft:Q4_K_M") == Path(theirs) and hub.count() == 0


def test_default_quant_and_cached_default(hub, hub_home):
    assert H.pull("org/main").files == ["main-Q4_K_M.gguf"]
    hub.reset()
    assert H.resolve_model("org/main").name == "main-Q4_K_M.gguf" and hub.count() == 0


def test_cached_non_default_quant_is_not_taken_for_the_default_online(hub, hub_home):
    H.pull("org/main:Q8_0")
    hub.reset()
    # Online, `org/main` means what the Hub's listing picks (Q4_K_M), not whatever is cached...
    assert H.pull("org/main").files == ["main-Q4_K_M.gguf"]
    assert hub.count("GET", "/api/models/") == 1


def test_offline_default_quant_uses_what_is_cached(hub, hub_home):
    H.pull("org/main:Q8_0")
    hub.reset()
    assert H.resolve_model("org/main", offline=True).name == "main-Q8_0.gguf" and hub.count() == 0


def test_revision_branch_and_commit(hub, hub_home):
    v2 = H.pull("org/main@v2:Q8_0")
    assert v2.commit == hub.commits["main@v2"] and v2.files == ["main-v2-Q8_0.gguf"]
    refs = Path(hub_home["HF_HUB_CACHE"]) / "models--org--main" / "refs"
    assert (refs / "v2").read_text() == hub.commits["main@v2"] and not (refs / "main").exists()
    hub.reset()
    by_sha = H.pull(f"org/main@{hub.commits['main@v2']}/main-v2-Q8_0.gguf")
    assert by_sha.path == v2.path and by_sha.cached and hub.count() == 0
    # the main branch does not have that file
    err = hub_error(H.pull, "org/main/main-v2-Q8_0.gguf")
    assert err.message == "no file main-v2-Q8_0.gguf in org/main@main"
    assert "main-Q4_K_M.gguf" in err.hint


def test_sharded_download_gets_every_part_and_loads_from_the_first(hub, hub_home, tiny_models):
    pulled = H.pull("org/sharded:Q8_0")
    assert [Path(f).name for f in pulled.files] == [f"model-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert pulled.path.name == "model-Q8_0-00001-of-00003.gguf"
    assert all(p.is_file() and p.parent == pulled.path.parent for p in pulled.paths)
    assert pulled.size == sum(p.stat().st_size for p in pulled.paths) == pulled.downloaded
    hub.reset()
    # naming part 2 resolves to part 1, from the cache
    assert H.resolve_model("org/sharded/Q8_0/model-Q8_0-00002-of-00003.gguf") == pulled.path
    assert hub.count() == 0
    h = H.read_model_header("org/sharded:Q8_0")
    assert h.file_size == pulled.size and h.architecture == "llama"


def test_cdn_redirect_keeps_the_token_on_the_hub(hub, hub_home, monkeypatch):
    hub.redirect_to_cdn = True
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    pulled = H.pull("org/private:Q4_K_M")
    assert pulled.path.is_file()
    cdn = hub.matching("GET", "/cdn/")
    assert len(cdn) == 1 and not cdn[0].auth            # the signed CDN URL gets no token
    assert all(r.auth for r in hub.matching("HEAD"))    # the Hub does


# ---- resume ----------------------------------------------------------------------------------------


def test_cut_connections_resume_within_one_pull(hub, hub_home):
    hub.cut("main-Q8_0", after=100_000, times=3)
    pulled = H.pull("org/main:Q8_0")
    gets = file_gets(hub, "main-Q8_0")
    assert [g.range for g in gets] == [None, "bytes=100000-", "bytes=200000-", "bytes=300000-"]
    assert hub.bytes_sent("main-Q8_0") == pulled.size  # nothing fetched twice
    assert pulled.path.stat().st_size == pulled.size


def test_interrupted_pull_fails_fast_and_the_next_one_resumes(hub, hub_home):
    hub.cut("main-Q8_0", after=300_000, then_down=True)  # the network dies mid-file
    start = time.monotonic()
    err = hub_error(H.pull, "org/main:Q8_0")
    assert time.monotonic() - start < HANG_GUARD_S   # no retrying for minutes on a dead network
    assert err.message.startswith("download of main-Q8_0.gguf interrupted: lost the connection to")
    assert "293.0 KiB of" in err.message and "resume" in err.hint
    partial = list((Path(hub_home["HF_HUB_CACHE"]) / "models--org--main" / "blobs").glob("*.incomplete"))
    assert len(partial) == 1 and partial[0].stat().st_size == 300_000

    hub.down = False
    hub.reset()
    reports = []

    @contextmanager
    def progress():  # what the CLI's bar gets: (file, bytes done, bytes total), from the resume point
        yield lambda *report: reports.append(report)

    pulled = H.pull("org/main:Q8_0", progress=progress)
    gets = file_gets(hub, "main-Q8_0")
    assert [g.range for g in gets] == ["bytes=300000-"]
    assert gets[0].sent == pulled.size - 300_000 == pulled.downloaded
    assert not partial[0].exists()
    label = "org/main/main-Q8_0.gguf"
    assert reports[0] == (label, 300_000, pulled.size) and reports[-1] == (label, pulled.size, pulled.size)
    assert [done for _, done, _ in reports] == sorted(done for _, done, _ in reports)


def test_partial_file_of_a_different_version_is_discarded(hub, hub_home):
    H.pull("org/draft:Q4_K_M")  # creates the repo folder
    folder = Path(hub_home["HF_HUB_CACHE"]) / "models--org--draft" / "blobs"
    listing = remote.list_repo(parse_ref("org/draft:Q8_0"))
    parts = download._plan(listing, ["draft-Q8_0.gguf"], Path(hub_home["HF_HUB_CACHE"]))
    bogus = folder / (parts[0].etag + ".incomplete")
    bogus.write_bytes(b"x" * (parts[0].size + 10))  # longer than the file: not a prefix of it
    pulled = H.pull("org/draft:Q8_0")
    assert read_file(pulled.path).architecture == "llama"


# ---- remote header reads -----------------------------------------------------------------------------


def test_remote_header_reads_a_small_fraction_and_downloads_nothing(hub, hub_home, tiny_models):
    h = H.read_model_header("org/main:Q8_0")
    local = read_file(tiny_models["target"])
    assert vocab_from_header(h).fingerprint == vocab_from_header(local).fingerprint
    assert h.file_size == tiny_models["target"].stat().st_size + 64
    gets = file_gets(hub, "main-Q8_0")
    assert [g.range for g in gets] == [f"bytes=0-{remote.FIRST_BLOCK - 1}"]
    assert hub.bytes_sent("main-Q8_0") == remote.FIRST_BLOCK < h.file_size / 7
    assert not (Path(hub_home["HF_HUB_CACHE"]) / "models--org--main" / "blobs").exists()


def test_remote_header_of_a_big_vocabulary_grows_its_ranges(hub, hub_home, big_vocab_gguf):
    h = H.read_model_header("org/big")
    assert len(vocab_from_header(h).tokens) == 150_000
    gets = file_gets(hub, "big-F32")
    fetched = hub.bytes_sent("big-F32")
    size = big_vocab_gguf.stat().st_size
    sizes = [g.sent for g in gets]
    assert sizes == [remote.FIRST_BLOCK * 2 ** i for i in range(len(sizes))]  # doubling blocks
    assert h.bytes_read <= fetched < 2 * h.bytes_read + remote.FIRST_BLOCK
    assert fetched < size / 5, (fetched, size)
    print(f"big vocab: header {h.bytes_read:,} B, fetched {fetched:,} B in {len(gets)} requests, file {size:,} B")


def test_remote_header_follows_the_cdn_once(hub, hub_home):
    hub.redirect_to_cdn = True
    H.read_model_header("org/big")
    resolves = hub.matching("GET", "/resolve/")
    assert len(resolves) == 1 and len(hub.matching("GET", "/cdn/")) >= 2  # later ranges go straight to the CDN


def test_remote_header_of_a_private_repo_sends_the_token_to_the_hub_only(hub, hub_home, monkeypatch):
    hub.redirect_to_cdn = True
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert H.read_model_header("org/private").architecture == "llama"
    assert all(r.auth for r in hub.matching("GET", "/org/private/"))
    assert all(r.auth for r in hub.matching("GET", "/api/"))
    cdn = hub.matching("GET", "/cdn/")
    assert cdn and not any(r.auth for r in cdn)


def test_cached_header_read_is_local(hub, hub_home):
    pulled = H.pull("org/main:Q8_0")
    hub.reset()
    h = H.read_model_header("org/main:Q8_0")
    assert hub.count() == 0 and h.source == str(pulled.path)


def test_header_read_of_a_local_path_never_touches_the_hub(hub, hub_home, tiny_models):
    assert H.read_model_header(str(tiny_models["draft"])).architecture == "llama" and hub.count() == 0


# ---- errors: one line, a hint, fast ----------------------------------------------------------------


def test_repository_not_found(hub, hub_home):
    err = hub_error(H.pull, "org/nope:Q8_0")
    assert err.message == "repository org/nope not found on the Hub" and "HF_TOKEN" in err.hint


def test_gated_repo_needs_a_token(hub, hub_home, monkeypatch):
    err = hub_error(H.read_model_header, "org/gated")
    assert err.message == "org/gated is gated: downloading it needs a token"
    assert f"{hub.url}/org/gated" in err.hint and "HF_TOKEN" in err.hint
    monkeypatch.setenv("HF_TOKEN", OTHER_TOKEN)
    err = hub_error(H.pull, "org/gated")
    assert err.message == "org/gated is gated and your token has no access to it"
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert H.pull("org/gated").path.is_file()


def test_private_repo_with_token(hub, hub_home, monkeypatch):
    assert "not found" in hub_error(H.pull, "org/private").message
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert H.pull("org/private").path.is_file()


def test_revision_not_found(hub, hub_home):
    err = hub_error(H.pull, "org/main@nope:Q8_0")
    assert err.message == "revision nope not found in org/main"


def test_no_such_quant_lists_available(hub, hub_home):
    err = hub_error(H.read_model_header, "org/main:Q5_K_M")
    assert err.message == "no Q5_K_M file in org/main@main" and err.hint == "available quants: Q4_K_M, Q8_0"
    err = hub_error(H.pull, "org/nogguf")
    assert err.message == "no GGUF model files in org/nogguf@main"


def test_not_cached_while_offline(hub, hub_home, monkeypatch):
    err = hub_error(H.resolve_model, "org/main:Q8_0", offline=True)
    assert err.message == "org/main:Q8_0 is not in the cache and offline mode is on"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_error(H.read_model_header, "org/main:Q8_0")
    assert hub.count() == 0


def test_offline_env_uses_the_cache(hub, hub_home, monkeypatch):
    path = H.pull("org/main:Q8_0").path
    hub.reset()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert H.resolve_model("org/main:Q8_0") == path
    assert H.pull("org/main:Q8_0", update=True).path == path  # offline: --update cannot ask, the cache answers
    assert hub.count() == 0


@pytest.mark.parametrize("call", [H.pull, H.read_model_header])
def test_network_down_is_reported_fast(hub, hub_home, call):
    hub.stop()
    start = time.monotonic()
    err = hub_error(call, "org/main:Q8_0")
    assert time.monotonic() - start < HANG_GUARD_S   # no retrying for minutes on a dead network
    assert err.message.startswith(f"cannot reach the Hugging Face Hub at {hub.url}")
    assert "HF_HUB_OFFLINE" in err.hint


def test_not_enough_disk_space_is_refused_before_downloading(hub, hub_home, monkeypatch, tiny_models):
    monkeypatch.setattr(download, "free_bytes", lambda path: 1000)
    err = hub_error(H.pull, "org/main:Q8_0")
    need = download.human_size(tiny_models["target"].stat().st_size + 64)
    assert err.message.startswith(f"not enough disk space: the download needs {need}, 1000 B free in")
    assert file_gets(hub, "main-Q8_0") == []


def test_disk_full_while_writing_keeps_the_partial(hub, hub_home, monkeypatch):
    real_open = open

    class Full:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            if self.n + len(data) > 200_000:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.n += len(data)
            return self.f.write(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(download, "open", lambda p, mode: Full(real_open(p, mode)), raising=False)
    err = hub_error(H.pull, "org/main:Q8_0")
    assert err.message.startswith("disk full while downloading main-Q8_0.gguf")
    assert "resume" in err.hint


def test_explain_maps_leaked_hub_exceptions():
    import httpx2
    from huggingface_hub.errors import LocalEntryNotFoundError

    ex = explain(httpx2.ConnectError("[Errno 111] Connection refused"))
    assert ex is not None and ex.message.startswith("cannot reach the Hugging Face Hub") and ex.exit_code == 1
    ex = explain(LocalEntryNotFoundError("x"))
    assert ex is not None and "not in the cache" in ex.message


# ---- cache listing ----------------------------------------------------------------------------------


def test_list_cached_ggufs(hub, hub_home, tiny_models):
    H.pull("org/main:Q8_0")
    H.pull("org/sharded:Q8_0")
    H.pull("org/main@v2:Q8_0")
    entries = {e.ref: e for e in cache.list_cached_ggufs()}
    assert set(entries) == {"org/main/main-Q8_0.gguf", "org/main@v2/main-v2-Q8_0.gguf",
                            "org/sharded/Q8_0/model-Q8_0-00001-of-00003.gguf"}
    sharded = entries["org/sharded/Q8_0/model-Q8_0-00001-of-00003.gguf"]
    assert sharded.parts == 3 and sharded.size == tiny_models["target"].stat().st_size + 300_000 + 100_000
    # every listed ref resolves back to its file from the cache alone
    hub.reset()
    for ref, e in entries.items():
        assert H.resolve_model(ref) == e.path
    assert hub.count() == 0


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"


def test_hub_modules_do_not_import_llama_cpp():
    src = Path(H.__file__).parent
    for f in src.glob("*.py"):
        assert "llama_cpp" not in f.read_text(), f
    assert os.path.exists(src / "refs.py")


def test_an_endpoint_that_is_not_a_hub(hub, hub_home, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url + "/not-a-hub")
    err = hub_error(H.pull, "org/main:Q8_0")
    assert err.message == f"{hub.url}/not-a-hub answered HTTP 404 for org/main:Q8_0"
    assert err.hint == "check HF_ENDPOINT and proxy settings"


def test_the_installed_huggingface_hub_is_the_one_the_local_hub_emulates():
    """tests/hub_server.py speaks huggingface_hub 2.4's protocol; pyproject pins that range so a
    user never runs a version these tests did not cover."""
    import re

    import huggingface_hub
    from packaging.requirements import Requirement

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()   # (tomllib: 3.11+)
    (req,) = [Requirement(d) for d in re.findall(r'^\s*"(huggingface-hub[^"]*)"', pyproject, re.M)]
    assert huggingface_hub.__version__ in req.specifier, (huggingface_hub.__version__, str(req.specifier))
    assert str(req.specifier) in (">=2.4,<2.5", "<2.5,>=2.4"), "widen only with the local Hub checked on the new range"
