"""OMP_WAIT_POLICY chosen from the machine's load (runtime/wait_policy.py): passive waiting when our
threads would not have the cores to themselves, the user's setting always kept, and `run` doing it
before llama.cpp loads (a busy machine made spinning threads 18x slower here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llamaspec.runtime import wait_policy
from llamaspec.runtime.wait_policy import choose

REPO = Path(__file__).resolve().parents[1]


def test_busy_means_passive_quiet_means_default_and_the_user_wins():
    assert choose(2, load=0.2, cores=2, env={}).value is None
    assert choose(2, load=1.0, cores=16, env={}).value is None
    assert choose(2, load=3.0, cores=2, env={}).value == "PASSIVE"
    assert choose(None, load=1.5, cores=2, env={}).value == "PASSIVE"    # all cores asked, one already busy
    kept = choose(2, load=11.0, cores=2, env={"OMP_WAIT_POLICY": "ACTIVE"})
    assert kept.value is None and "set by you" in kept.reason


_RUN_BUSY = """
import os, sys
os.environ.pop("OMP_WAIT_POLICY", None)
from llamaspec.runtime import wait_policy
wait_policy.others_running = lambda: 50.0           # a very busy machine
from llamaspec.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    sys.stderr.write("POLICY=%s EXIT=%s" % (os.environ.get("OMP_WAIT_POLICY"), e.code))
"""


def test_run_on_a_busy_machine_waits_passively_and_says_so_with_v(tiny_models):
    r = subprocess.run([sys.executable, "-c", _RUN_BUSY, "run", str(tiny_models["target"]), "-p", "hi", "-n", "3",
                        "--temp", "0", "-t", "1", "--spec-type", "none", "-v"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert "POLICY=PASSIVE EXIT=0" in r.stderr, r.stderr[-2000:]
    assert "wait passively" in r.stderr


def test_the_load_average_of_our_own_previous_run_does_not_make_the_next_one_passive(monkeypatch):
    """A minute's load average counts the run that just ended (2 cores, -t 2: ~1.3 after one run),
    and passive waiting halves single-stream decoding on a quiet machine: what counts is who wants
    a CPU now. The load average is only the fallback where there is no /proc."""
    monkeypatch.setattr(os, "getloadavg", lambda: (1.3, 1.0, 0.8), raising=False)
    monkeypatch.setattr(wait_policy, "others_running", lambda: 0.0)
    assert choose(2, cores=2, env={}).value is None
    monkeypatch.setattr(wait_policy, "others_running", lambda: None)   # no /proc/stat
    assert choose(2, cores=2, env={}).value == "PASSIVE" and "load average" in choose(2, cores=2, env={}).reason


def test_threads_that_want_a_cpu_now_are_counted():
    """Real busy processes, more than the cores: they are seen as running now, and a run that
    wants every core waits passively beside them."""
    if wait_policy.others_running() is None:
        import pytest

        pytest.skip("no /proc/stat on this system")
    cores = os.cpu_count() or 1
    spin = "import sys; sys.stdout.write('go\\n'); sys.stdout.flush()\nwhile True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
             for _ in range(cores + 2)]
    try:
        for p in procs:
            assert p.stdout.readline() == "go\n"
        seen = wait_policy.others_running(samples=20)
        policy = choose(None, env={})
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert seen >= cores, (seen, cores)   # cores + 2 spinners, runnable all the time
    assert policy.value == "PASSIVE" and "other threads running" in policy.reason


def test_doctor_says_why_it_chose_passive_not_that_you_set_it():
    """The CLI sets the policy for itself at start-up; doctor then must not report the variable
    it finds as the user's choice."""
    busy = ("import os, sys\nos.environ.pop('OMP_WAIT_POLICY', None)\n"
            "from llamaspec.runtime import wait_policy\nwait_policy.others_running = lambda: 50.0\n"
            "from llamaspec.cli import main\nmain(['doctor', '--json'])\n")
    r = subprocess.run([sys.executable, "-c", busy], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    import json

    doc = json.loads(r.stdout)
    assert "the machine is busy" in doc["thread_wait"] and "set by you" not in doc["thread_wait"], doc["thread_wait"]
