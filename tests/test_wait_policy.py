"""How llama.cpp's OpenMP threads wait (runtime/wait_policy.py): on libgomp a bounded spin, PASSIVE
only when the CPUs have been oversubscribed for a while (a 3 s busy loop at start used to make a
whole run passive, 41 vs 91 tok/s), the user's variables always kept, the old load rule only where
no bounded spin is measured, and `run` setting it before llama.cpp loads (libgomp reads it once)."""

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
SPIN = {"GOMP_SPINCOUNT": str(SPINCOUNT)}
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
# CPU pressure (percent over 10 s, over 60 s) and other threads runnable at the moment of choosing
REGIMES = {
    "quiet": ((1.0, 3.0), 0.0, SPIN),
    "transient at start": ((15.0, 3.0), 2.0, SPIN),      # a 3 s burst: runnable now, little pressure yet
    "burst of 10 s": ((63.0, 15.0), 2.0, SPIN),           # not a minute's worth
    "sustained": ((95.0, 80.0), 4.0, PASSIVE),
    "sustained, quiet this instant": ((90.0, 70.0), 0.0, PASSIVE),
    "overloaded": ((100.0, 100.0), 11.0, PASSIVE),
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_on_libgomp_a_bounded_spin_unless_oversubscribed_for_a_while(regime):
    """What a moment shows decides nothing (the threads runnable now are not even read when the CPU
    pressure is known): a transient competitor gets the quiet machine's bounded spin, a load that
    held the CPUs over 10 s and 60 s gets PASSIVE."""
    pressure, now, expected = REGIMES[regime]
    policy = choose(2, runtime="libgomp", pressure=pressure, load=now, cores=2, env={})
    assert policy.env == expected
    assert policy.line.startswith(f"{wait_policy.LINE_PREFIX} {next(iter(expected))}=")
    assert f"CPU pressure {pressure[0]:.0f}% over 10 s" in policy.reason


def test_without_cpu_pressure_the_load_average_and_the_moment_must_agree(monkeypatch):
    """No /proc/pressure: PASSIVE only when the minute's load average exceeds the cores plus our
    own threads (our previous run counts in it) and other threads fill the cores now."""
    for loadavg, now, expected in [(6.0, 4.0, PASSIVE), (6.0, 0.0, SPIN), (1.3, 4.0, SPIN), (3.0, 2.0, SPIN)]:
        monkeypatch.setattr(os, "getloadavg", lambda a=loadavg: (a, a, a), raising=False)
        policy = choose(2, runtime="libgomp", pressure=None, load=now, cores=2, env={})
        assert policy.env == expected, (loadavg, now)
        assert f"load average {loadavg:.1f}" in policy.reason


def test_cpu_pressure_is_read_where_linux_has_it():
    p = wait_policy.cpu_pressure()
    if p is None:
        pytest.skip("no /proc/pressure/cpu here")
    assert all(0.0 <= v <= 100.0 for v in p)


@pytest.mark.parametrize("var,value", [("OMP_WAIT_POLICY", "ACTIVE"), ("OMP_WAIT_POLICY", "PASSIVE"),
                                        ("GOMP_SPINCOUNT", "5"), ("KMP_BLOCKTIME", "0")])
@pytest.mark.parametrize("runtime", ["libgomp", "libomp", None])
def test_the_users_variable_wins_in_every_regime(var, value, runtime):
    for pressure, now, _ in REGIMES.values():
        kept = choose(2, runtime=runtime, pressure=pressure, load=now, cores=2, env={var: value})
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


QUIET, LOADED = (1.0, 3.0), (95.0, 80.0)   # CPU pressure over 10 s, 60 s
# llamaspec's CLI with the CPU pressure it reads fixed (the machine running the tests is shared)
_CLI = """
import sys
from llamaspec.runtime import wait_policy
wait_policy.cpu_pressure = lambda: %r
from llamaspec.cli import main
main(sys.argv[1:])
"""
_APPLY = """
import json, os, sys
from llamaspec.runtime import wait_policy
wait_policy.cpu_pressure = lambda: %r
first = wait_policy.apply(2)
env = {v: os.environ.get(v) for v in wait_policy.USER_VARS}
again = wait_policy.apply(2)   # the Generator calls it again: the first decision holds
import llama_cpp
print(json.dumps({"first": first, "again": again, "env": env, "applied": wait_policy.applied()}))
"""


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in wait_policy.USER_VARS}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _libgomp_only():
    if openmp_runtime() != "libgomp":
        pytest.skip("llama_cpp here is not built with libgomp")


def test_apply_sets_the_variables_once_and_keeps_the_users():
    _libgomp_only()
    for pressure, expected in [(QUIET, SPIN), (LOADED, PASSIVE)]:
        r = subprocess.run([sys.executable, "-c", _APPLY % (pressure,)], capture_output=True, text=True,
                           env=_clean_env(), timeout=120)
        out = json.loads(r.stdout)
        assert out["first"] == out["again"] == out["applied"] and out["first"].startswith(wait_policy.LINE_PREFIX)
        assert {k: v for k, v in out["env"].items() if v is not None} == expected
    r = subprocess.run([sys.executable, "-c", _APPLY % (LOADED,)], capture_output=True, text=True,
                       env=_clean_env(GOMP_SPINCOUNT="20"), timeout=120)
    out = json.loads(r.stdout)
    assert out["env"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "20", "KMP_BLOCKTIME": None}
    assert out["first"].endswith("GOMP_SPINCOUNT=20 (set by you)")


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


@pytest.mark.parametrize("pressure,user,line,spincount", [
    (QUIET, {}, f"GOMP_SPINCOUNT={SPINCOUNT} (libgomp; CPU pressure 1% over 10 s, 3% over 60 s)", str(SPINCOUNT)),
    (LOADED, {}, "OMP_WAIT_POLICY=PASSIVE (libgomp; CPU pressure 95% over 10 s, 80% over 60 s)", "0"),
    (QUIET, {"OMP_WAIT_POLICY": "PASSIVE"}, "OMP_WAIT_POLICY=PASSIVE (set by you)", "0"),
])
def test_run_v_says_what_was_chosen_and_libgomp_read_it(tiny_models, pressure, user, line, spincount):
    """`llamaspec run -v` prints the one line, and libgomp itself (OMP_DISPLAY_ENV) reports the
    variables as set when llama.cpp loaded: the choice is made in time, not only reported."""
    _libgomp_only()
    r = subprocess.run([sys.executable, "-c", _CLI % (pressure,), "run", str(tiny_models["target"]), "-p", "hi",
                        "-n", "3", "--temp", "0", "-t", "2", "--spec-type", "none", "-v"], capture_output=True,
                       text=True, env=_clean_env(OMP_DISPLAY_ENV="VERBOSE", **user), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [s for s in r.stderr.splitlines() if s.startswith(wait_policy.LINE_PREFIX)]
    assert len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"{wait_policy.LINE_PREFIX} {line}"), lines[0]
    assert _display(r.stderr)["GOMP_SPINCOUNT"] == spincount


def test_doctor_says_what_was_chosen_and_why_not_that_you_set_it():
    """The CLI sets the variables for itself at start-up; doctor then reports that choice, not the
    variable it finds as the user's."""
    def doctor(**env):
        r = subprocess.run([sys.executable, "-c", _CLI % (LOADED,), "doctor", "--json"], capture_output=True,
                           text=True, env=_clean_env(**env), timeout=120)
        return json.loads(r.stdout)

    doc = doctor()
    assert doc["openmp_runtime"] == openmp_runtime()
    if doc["openmp_runtime"] == "libgomp":
        assert doc["thread_wait_env"] == PASSIVE
        assert doc["thread_wait"].startswith("OMP_WAIT_POLICY=PASSIVE (libgomp; CPU pressure 95% over 10 s")
    assert "set by you" not in doc["thread_wait"]
    doc = doctor(GOMP_SPINCOUNT="7")
    assert doc["thread_wait"] == "GOMP_SPINCOUNT=7 (set by you)" and doc["thread_wait_env"] == {}


def test_the_module_examples_hold():
    import doctest

    assert doctest.testmod(wait_policy).failed == 0
