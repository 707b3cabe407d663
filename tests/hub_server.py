"""A real local Hugging Face Hub on 127.0.0.1, in a thread, for huggingface_hub 2.4 to talk to.

Implements what huggingface_hub 2.x needs of a Hub: model info with siblings, tree listing, HEAD/GET on
/resolve/ with ETag, X-Repo-Commit and Range (206), X-Error-Code errors. Switches: cut a file's
GET after N bytes, gated and private repos, redirecting downloads to a "CDN" on another origin
(localhost instead of 127.0.0.1), and a log of every request with the bytes sent.

Hostile switches (tests/test_hub_hardening.py): any file name in a listing (`add_repo` takes them
as given: '../x.gguf', NUL, '/abs'), and `tamper`: serve other bytes than the listing's size and
sha256 describe (truncated, longer, same size but corrupt), list a wrong size, send a hostile
ETag; `bad_commit` makes model info answer with a hostile commit id.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

TOKEN = "hf_test_token_ok"        # a token the private/gated repos accept
OTHER_TOKEN = "hf_test_token_no"  # a valid token without access to gated repos


@dataclass
class Blob:
    data: bytes                  # what the listing, HEAD and ETag describe
    sha256: str
    serve: bytes | None = None   # what a GET actually sends, if not `data` (tamper)
    listed_size: int | None = None  # the size the listing claims, if not len(data)
    etag: str | None = None      # the ETag sent, if not the sha256


@dataclass
class Repo:
    repo_id: str
    branches: dict[str, str] = field(default_factory=dict)    # name -> commit
    commits: dict[str, dict[str, Blob]] = field(default_factory=dict)
    gated: bool = False
    private: bool = False
    bad_commit: str | None = None  # model info's "sha", if not the real commit (a hostile Hub)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int = 0
    sent: int = 0          # body bytes sent
    auth: bool = False     # an Authorization header came with it


@dataclass
class Cut:
    match: str             # substring of the request path
    after: int             # bytes of body sent before hanging up
    times: int = 1
    then_down: bool = False  # after cutting, hang up on every request until `down` is cleared


def _size(b: Blob) -> int:
    return len(b.data) if b.listed_size is None else b.listed_size


def _commit_id(repo_id: str, n: int) -> str:
    return hashlib.sha1(f"{repo_id}#{n}".encode()).hexdigest()


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.cuts: list[Cut] = []
        self.redirect_to_cdn = False
        self.down = False  # hang up on every request without answering (a dead network path)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0

    # ---- content ---------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, bytes | Path], *, branch: str = "main",
                 gated: bool = False, private: bool = False) -> str:
        """Add (or add a commit to) a repo; `branch` then points at the new commit. Returns its sha."""
        repo = self.repos.setdefault(repo_id, Repo(repo_id))
        repo.gated, repo.private = repo.gated or gated, repo.private or private
        blobs = {}
        for path, content in files.items():
            data = Path(content).read_bytes() if isinstance(content, (str, Path)) else bytes(content)
            blobs[path] = Blob(data, hashlib.sha256(data).hexdigest())
        commit = _commit_id(repo_id, len(repo.commits))
        repo.commits[commit] = blobs
        repo.branches[branch] = commit
        return commit

    def tamper(self, repo_id: str, path: str, *, serve: bytes | None = None, listed_size: int | None = None,
               etag: str | None = None, branch: str = "main") -> None:
        """Make `path` misbehave: GET sends `serve`, the listing claims `listed_size`, HEAD sends `etag`."""
        repo = self.repos[repo_id]
        blob = repo.commits[repo.branches[branch]][path]
        blob.serve, blob.listed_size, blob.etag = serve, listed_size, etag

    # ---- switches and counters -------------------------------------------------------------------
    def cut(self, match: str, after: int, times: int = 1, then_down: bool = False) -> None:
        """Hang up the next `times` GETs whose path contains `match` after `after` body bytes."""
        self.cuts.append(Cut(match, after, times, then_down))

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()

    def count(self, method: str | None = None, contains: str = "") -> int:
        return len(self.matching(method, contains))

    def matching(self, method: str | None = None, contains: str = "") -> list[Request]:
        with self._lock:
            return [r for r in self.requests if (method is None or r.method == method) and contains in r.path]

    def bytes_sent(self, contains: str = "") -> int:
        return sum(r.sent for r in self.matching("GET", contains))

    # ---- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> "HubServer":
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and hang up every open (keep-alive) connection: the Hub is gone."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "HubServer":
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.hub._lock:
            self.hub._conns.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.hub._lock:
                self.hub._conns.discard(self.connection)

    # ---- plumbing --------------------------------------------------------------------------------
    def _record(self) -> Request:
        req = Request(self.command, unquote(urlsplit(self.path).path), self.headers.get("Range"),
                      auth=self.headers.get("Authorization") is not None)
        with self.hub._lock:
            self.hub.requests.append(req)
        return req

    def _send(self, req: Request, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        req.status = status
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            req.sent += len(body)  # counted before the write: the client may look before we return
            self.wfile.write(body)

    def _json(self, req: Request, obj) -> None:
        self._send(req, 200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _error(self, req: Request, status: int, code: str, message: str, extra: dict | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(req, status, body, {"X-Error-Code": code, "X-Error-Message": message,
                                       "Content-Type": "application/json", **(extra or {})})

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[len("Bearer "):] if auth.startswith("Bearer ") else None

    def _repo(self, req: Request, repo_id: str, files: bool) -> Repo | None:
        """The repo if visible to this request, else answer with the Hub's error and return None."""
        repo = self.hub.repos.get(repo_id)
        token = self._token()
        if repo is None or (repo.private and token != TOKEN):
            self._error(req, 401, "RepoNotFound", "Repository not found")
            return None
        if files and repo.gated and token != TOKEN:
            status = 403 if token else 401
            self._error(req, status, "GatedRepo", f"Access to model {repo_id} is restricted.")
            return None
        return repo

    def _commit(self, req: Request, repo: Repo, rev: str) -> str | None:
        if rev in repo.commits:
            return rev
        if rev in repo.branches:
            return repo.branches[rev]
        self._error(req, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return None

    # ---- routes ----------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        req = self._record()
        if self.hub.down:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        raw = urlsplit(self.path).path
        segs = [unquote(s) for s in raw.strip("/").split("/")]
        try:
            if segs[:2] == ["api", "models"] and len(segs) >= 4:
                return self._api(req, segs[2:])
            if len(segs) >= 5 and segs[2] == "resolve":
                return self._resolve(req, f"{segs[0]}/{segs[1]}", segs[3], "/".join(segs[4:]))
            if segs[0] == "cdn" and len(segs) == 2:
                return self._cdn(req, segs[1])
            self._error(req, 404, "NotFound", f"no route {raw}")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _api(self, req: Request, segs: list[str]) -> None:
        repo = self._repo(req, f"{segs[0]}/{segs[1]}", files=False)
        if repo is None:
            return
        rest = segs[2:]
        if not rest or rest[0] == "revision":
            rev = "/".join(rest[1:]) if rest else "main"
            commit = self._commit(req, repo, rev)
            if commit is None:
                return
            blobs = repo.commits[commit]
            return self._json(req, {
                "id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.bad_commit or commit,
                "private": repo.private, "gated": "manual" if repo.gated else False, "tags": ["gguf"],
                "siblings": [{"rfilename": p, "size": _size(b), "blobId": hashlib.sha1(b.data).hexdigest(),
                              "lfs": {"size": _size(b), "sha256": b.sha256, "pointerSize": 134}}
                             for p, b in sorted(blobs.items())],
            })
        if rest[0] == "tree" and len(rest) >= 2:
            commit = self._commit(req, repo, rest[1])
            if commit is None:
                return
            prefix = "/".join(rest[2:])
            items = [{"type": "file", "path": p, "oid": hashlib.sha1(b.data).hexdigest(), "size": len(b.data),
                      "lfs": {"oid": b.sha256, "size": len(b.data), "pointerSize": 134}}
                     for p, b in sorted(repo.commits[commit].items()) if p.startswith(prefix)]
            return self._json(req, items)
        self._error(req, 404, "NotFound", "unknown api route")

    def _resolve(self, req: Request, repo_id: str, rev: str, path: str) -> None:
        repo = self._repo(req, repo_id, files=True)
        if repo is None:
            return
        commit = self._commit(req, repo, rev)
        if commit is None:
            return
        blob = repo.commits[commit].get(path)
        if blob is None:
            return self._error(req, 404, "EntryNotFound", f"{path} does not exist", {"X-Repo-Commit": commit})
        meta = {"X-Repo-Commit": commit, "ETag": f'"{blob.etag or blob.sha256}"', "Accept-Ranges": "bytes"}
        if self.hub.redirect_to_cdn:
            # Another origin (localhost vs 127.0.0.1), like the Hub's CDN: metadata rides on the redirect.
            location = f"http://localhost:{self.hub.port}/cdn/{blob.sha256}"
            return self._send(req, 302, b"", {**meta, "Location": location, "X-Linked-Etag": f'"{blob.sha256}"',
                                              "X-Linked-Size": len(blob.data)})
        self._body(req, blob.serve if blob.serve is not None and self.command == "GET" else blob.data, meta)

    def _cdn(self, req: Request, sha: str) -> None:
        for repo in self.hub.repos.values():
            for blobs in repo.commits.values():
                for b in blobs.values():
                    if b.sha256 == sha:
                        data = b.serve if b.serve is not None and self.command == "GET" else b.data
                        return self._body(req, data, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"})
        self._error(req, 404, "NotFound", "no such blob")

    def _body(self, req: Request, data: bytes, headers: dict) -> None:
        size = len(data)
        status, start, end = 200, 0, size - 1
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m[1]) >= size:
                return self._send(req, 416, b"", {"Content-Range": f"bytes */{size}"})
            start = int(m[1])
            end = min(int(m[2]), size - 1) if m[2] else size - 1
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{size}"}
        body = data[start:end + 1]
        cut = self._take_cut(req.path) if self.command == "GET" else None
        if cut is None:
            return self._send(req, status, body, headers)
        # Promise the whole body, send part of it, hang up: a dropped connection mid-file.
        req.status = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        req.sent += min(cut.after, len(body))
        if cut.then_down:
            self.hub.down = True
        self.wfile.write(body[:cut.after])
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _take_cut(self, path: str) -> Cut | None:
        with self.hub._lock:
            for c in self.hub.cuts:
                if c.times > 0 and c.match in path:
                    c.times -= 1
                    return c
        return None


# ---- test content and fixtures ---------------------------------------------------------------------

def write_big_vocab_gguf(path: Path, n_tokens: int = 150_000, weight_mib: int = 32) -> Path:
    """A GGUF whose header is MBs (a 150k-token vocabulary) before a big tensor: for ranged reads."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("bigvocab")
    w.add_context_length(2048)
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i:06d}" for i in range(n_tokens)])
    w.add_token_types([1] * n_tokens)
    w.add_tensor("token_embd.weight", np.zeros((weight_mib * 1024 * 256,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def standard_repos(server: HubServer, tiny: dict[str, Path], big: Path) -> dict[str, str]:
    """The repos the tests use; returns name -> commit of interesting revisions."""
    import random

    rnd = random.Random(5)
    commits = {}
    commits["main"] = server.add_repo("org/main", {
        "README.md": b"# tiny target\n",
        "main-Q4_K_M.gguf": tiny["target"],
        # Distinct bytes per file (trailing padding after the tensors), so blobs do not dedupe.
        "main-Q8_0.gguf": tiny["target"].read_bytes() + b"\0" * 64,
        "mmproj-main-F16.gguf": tiny["draft"].read_bytes() + b"\0" * 64,
    })
    commits["main@v2"] = server.add_repo("org/main", {"main-v2-Q8_0.gguf": tiny["draft"]}, branch="v2")
    server.add_repo("org/draft", {"draft-Q4_K_M.gguf": tiny["draft"],
                                  "draft-Q8_0.gguf": tiny["draft"].read_bytes() + b"\0" * 32})
    server.add_repo("org/other", {"other-Q4_K_M.gguf": tiny["other_vocab"]})
    server.add_repo("org/sharded", {
        "Q8_0/model-Q8_0-00001-of-00003.gguf": tiny["target"],
        "Q8_0/model-Q8_0-00002-of-00003.gguf": rnd.randbytes(300_000),
        "Q8_0/model-Q8_0-00003-of-00003.gguf": rnd.randbytes(100_000),
        "model-F16.gguf": tiny["draft"],
    })
    server.add_repo("org/big", {"big-F32.gguf": big})
    server.add_repo("org/gated", {"gated-Q4_K_M.gguf": tiny["draft"]}, gated=True)
    server.add_repo("org/private", {"private-Q4_K_M.gguf": tiny["draft"]}, private=True)
    server.add_repo("org/nogguf", {"model.safetensors": b"\0" * 100, "config.json": b"{}"})
    return commits


def hub_env(server: HubServer | None, home: Path, token: str | None = None) -> dict[str, str]:
    """Environment for a llamaspec/huggingface_hub process talking to `server` with a fresh cache."""
    env = {
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "HF_HUB_OFFLINE": "0",
        "HF_TOKEN": token or "",
    }
    env["HF_ENDPOINT"] = server.url if server is not None else "http://127.0.0.1:9"
    return env


try:
    import pytest
except ImportError:  # the server itself needs no pytest
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def big_vocab_gguf(tmp_path_factory) -> Path:
        return write_big_vocab_gguf(tmp_path_factory.mktemp("hub-content") / "big-F32.gguf")

    @pytest.fixture
    def hub(tiny_models, big_vocab_gguf):
        """A running local Hub with the standard repos; `hub.commits` names their revisions."""
        server = HubServer().start()
        server.commits = standard_repos(server, tiny_models, big_vocab_gguf)
        yield server
        server.stop()

    @pytest.fixture
    def hub_home(hub, tmp_path, monkeypatch) -> dict[str, str]:
        """Point this process (and children) at `hub` with a fresh HF cache; returns the env."""
        env = hub_env(hub, tmp_path / "hf")
        for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            if v:
                monkeypatch.setenv(k, v)
        env.pop("HF_TOKEN")
        # huggingface_hub read these at import; the tests' process may have imported it already.
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        return env
