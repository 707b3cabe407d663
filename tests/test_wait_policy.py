"""How llama.cpp's OpenMP threads wait (runtime/wait_policy.py): a bounded spin on libgomp, chosen
without sampling the load (a 3 s busy loop at start used to make a whole run passive, 41 vs 91
tok/s), the user's variables always kept, the old load rule only where no bounded spin is
measured, and `run` setting it before llama.cpp loads (libgomp reads it once, at load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamaspec.runtime import wait_policy
from llamaspec.runtime.wait_policy import SPINCOUNT, choose, openmp_runtime

REPO = Path(__file__).resolve().parents[1]
# other threads that want a CPU at the moment of choosing: quiet, a transient competitor at start
# (one busy loop on 2 cores), sustained oversubscription (4 busy loops, or a load of 11)
REGIMES = {"quiet": 0.0, "transient": 1.0, "sustained": 4.0, "overloaded": 11.0}


def test_on_libgomp_every_regime_gets_the_same_bounded_spin():
    """What a moment of the load shows decides nothing: a transient competitor and a quiet machine
    get the same policy (the load is not even read: a load of None, no /proc, changes nothing)."""
    chosen = {name: choose(2, runtime="libgomp", load=load, cores=2, env={}) for name, load in REGIMES.items()}
    for policy in chosen.values():
        assert policy.env == {"GOMP_SPINCOUNT": str(SPINCOUNT)}
    assert choose(None, runtime="libgomp", load=None, env={}).env == {"GOMP_SPINCOUNT": str(SPINCOUNT)}
    assert chosen["quiet"].line.startswith(wait_policy.LINE_PREFIX + " GOMP_SPINCOUNT=")


@pytest.mark.parametrize("var,value", [("OMP_WAIT_POLICY", "ACTIVE"), ("OMP_WAIT_POLICY", "PASSIVE"),
                                        ("GOMP_SPINCOUNT", "5"), ("KMP_BLOCKTIME", "0")])
@pytest.mark.parametrize("runtime", ["libgomp", "libomp", None])
def test_the_users_variable_wins_in_every_regime(var, value, runtime):
    for load in REGIMES.values():
        kept = choose(2, runtime=runtime, load=load, cores=2, env={var: value})
        assert kept.env == {} and kept.reason == f"{var}={value} (set by you)"


def test_without_a_measured_bounded_spin_the_load_rule_stays():
    """LLVM/Intel libomp or an unknown runtime: PASSIVE when other threads and ours exceed the
    cores now, OpenMP's default otherwise; a build without OpenMP has nothing to set."""
    for runtime in ("libomp", None):
        assert choose(2, runtime=runtime, load=0.2, cores=2, env={}).env == {}
        assert choose(2, runtime=runtime, load=1.0, cores=16, env={}).env == {}
        assert choose(2, runtime=runtime, load=3.0, cores=2, env={}).env == {"OMP_WAIT_POLICY": "PASSIVE"}
        assert choose(None, runtime=runtime, load=1.5, cores=2, env={}).env == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert "libomp" in choose(2, runtime="libomp", load=3.0, cores=2, env={}).reason
    none = choose(2, runtime="none", load=11.0, cores=2, env={})
    assert none.env == {} and "without OpenMP" in none.reason


def test_the_load_average_of_our_own_previous_run_does_not_make_the_next_one_passive(monkeypatch):
    """(The load rule, where it still applies.) A minute's load average counts the run that just
    ended; what counts is who wants a CPU now. The load average is only the fallback without /proc."""
    monkeypatch.setattr(os, "getloadavg", lambda: (1.3, 1.0, 0.8), raising=False)
    monkeypatch.setattr(wait_policy, "others_running", lambda: 0.0)
    assert choose(2, runtime=None, cores=2, env={}).env == {}
    monkeypatch.setattr(wait_policy, "others_running", lambda: None)   # no /proc/stat
    fallback = choose(2, runtime=None, cores=2, env={})
    assert fallback.env == {"OMP_WAIT_POLICY": "PASSIVE"} and "load average" in fallback.reason


def test_threads_that_want_a_cpu_now_are_counted():
    """Real busy processes, more than the cores: the load rule sees them as running now."""
    if wait_policy.others_running() is None:
        pytest.skip("no /proc/stat on this system")
    cores = os.cpu_count() or 1
    spin = "import sys; sys.stdout.write('go\\n'); sys.stdout.flush()\nwhile True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
             for _ in range(cores + 2)]
    try:
        for p in procs:
            assert p.stdout.readline() == "go\n"
        seen = wait_policy.others_running(samples=20)
        policy = choose(None, runtime=None, env={})
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()
    assert seen >= cores, (seen, cores)   # cores + 2 spinners, runnable all the time
    assert policy.env == {"OMP_WAIT_POLICY": "PASSIVE"} and "other threads running" in policy.reason


_MAPS = """
import llama_cpp
maps = open('/proc/self/maps').read()
print('libgomp' if 'libgomp' in maps else 'libomp' if ('libomp' in maps or 'libiomp5' in maps) else 'none')
"""


def test_the_openmp_runtime_is_read_from_the_libraries_before_they_load():
    """What the DT_NEEDED entries say is what the loaded process maps (checked in a subprocess that
    loads llama_cpp); a library without OpenMP reads "none", a file that is no library nothing."""
    if not sys.platform.startswith("linux"):
        pytest.skip("/proc/self/maps is Linux's")
    found = openmp_runtime()
    loaded = subprocess.run([sys.executable, "-c", _MAPS], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert found == loaded.stdout.strip(), (found, loaded.stdout)
    libs = wait_policy._llama_libs()
    base = [p for p in libs if p.name.startswith("libggml.")]
    if base:   # ggml's registry library links the backends, not OpenMP
        assert openmp_runtime(base[:1]) == "none"
    assert openmp_runtime([REPO / "README.md"]) is None and openmp_runtime([]) is None


_APPLY = """
import json, os, sys
from llamaspec.runtime import wait_policy
first = wait_policy.apply(2)
env = {v: os.environ.get(v) for v in wait_policy.USER_VARS}
again = wait_policy.apply(2)   # the Generator calls it again: the first decision holds
import llama_cpp
print(json.dumps({"first": first, "again": again, "env": env, "applied": wait_policy.applied()}))
"""


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in wait_policy.USER_VARS}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def test_apply_sets_the_variables_once_and_keeps_the_users():
    runtime = openmp_runtime()
    r = subprocess.run([sys.executable, "-c", _APPLY], capture_output=True, text=True, env=_clean_env(), timeout=120)
    out = json.loads(r.stdout)
    assert out["first"] == out["again"] == out["applied"] and out["first"].startswith(wait_policy.LINE_PREFIX)
    if runtime == "libgomp":
        assert out["env"]["GOMP_SPINCOUNT"] == str(SPINCOUNT) and out["env"]["OMP_WAIT_POLICY"] is None
    r = subprocess.run([sys.executable, "-c", _APPLY], capture_output=True, text=True,
                       env=_clean_env(OMP_WAIT_POLICY="PASSIVE"), timeout=120)
    out = json.loads(r.stdout)
    assert out["env"] == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None, "KMP_BLOCKTIME": None}
    assert out["first"].endswith("OMP_WAIT_POLICY=PASSIVE (set by you)")


def test_too_late_is_said_not_hidden():
    """llama_cpp imported before llamaspec chose (a program that uses both): nothing is set, and the
    line says so."""
    code = "import llama_cpp\nfrom llamaspec.runtime import wait_policy\nprint(wait_policy.apply(2))\nimport os\nprint(os.environ.get('GOMP_SPINCOUNT'))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(), timeout=120)
    line, spin = r.stdout.splitlines()
    assert "loaded before llamaspec could choose" in line and spin == "None"


def _display(stderr: str) -> dict:
    """libgomp's own OMP_DISPLAY_ENV block: what it read when it loaded."""
    pairs = (s.strip().split(" = ", 1) for s in stderr.splitlines() if " = '" in s)
    return {k: v.strip("'") for k, v in pairs}


@pytest.mark.parametrize("user", [{}, {"OMP_WAIT_POLICY": "PASSIVE"}])
def test_run_v_says_what_was_chosen_and_libgomp_read_it(tiny_models, user):
    """`llamaspec run -v` prints the one line, and libgomp itself (OMP_DISPLAY_ENV) reports the
    variable as set when llama.cpp loaded: the choice is made in time, not only reported."""
    if openmp_runtime() != "libgomp":
        pytest.skip("llama_cpp here is not built with libgomp")
    r = subprocess.run([sys.executable, "-m", "llamaspec", "run", str(tiny_models["target"]), "-p", "hi", "-n", "3",
                        "--temp", "0", "-t", "2", "--spec-type", "none", "-v"], capture_output=True, text=True,
                       env=_clean_env(OMP_DISPLAY_ENV="VERBOSE", **user), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [s for s in r.stderr.splitlines() if s.startswith(wait_policy.LINE_PREFIX)]
    read = _display(r.stderr)
    assert len(lines) == 1, r.stderr[-2000:]
    if user:
        assert lines[0].endswith("OMP_WAIT_POLICY=PASSIVE (set by you)")
        assert read["GOMP_SPINCOUNT"] == "0"        # PASSIVE's, untouched
    else:
        assert lines[0].startswith(f"{wait_policy.LINE_PREFIX} GOMP_SPINCOUNT={SPINCOUNT} (libgomp)")
        assert read["GOMP_SPINCOUNT"] == str(SPINCOUNT)


def test_doctor_says_what_was_chosen_and_why_not_that_you_set_it():
    """The CLI sets the variables for itself at start-up; doctor then reports that choice, not the
    variable it finds as the user's."""
    r = subprocess.run([sys.executable, "-m", "llamaspec", "doctor", "--json"], capture_output=True, text=True,
                       env=_clean_env(), timeout=120)
    doc = json.loads(r.stdout)
    assert "set by you" not in doc["thread_wait"] and doc["openmp_runtime"] == openmp_runtime()
    if doc["openmp_runtime"] in ("libgomp", "none"):   # (elsewhere the choice follows the load of the moment)
        expected = choose(None, env={})
        assert doc["thread_wait"] == expected.reason and doc["thread_wait_env"] == expected.env
    r = subprocess.run([sys.executable, "-m", "llamaspec", "doctor", "--json"], capture_output=True, text=True,
                       env=_clean_env(GOMP_SPINCOUNT="7"), timeout=120)
    doc = json.loads(r.stdout)
    assert doc["thread_wait"] == "GOMP_SPINCOUNT=7 (set by you)" and doc["thread_wait_env"] == {}


def test_the_module_examples_hold():
    import doctest

    assert doctest.testmod(wait_policy).failed == 0
