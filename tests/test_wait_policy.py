"""OMP_WAIT_POLICY chosen from the machine's load (runtime/wait_policy.py): passive waiting when our
threads would not have the cores to themselves, the user's setting always kept, and `run` doing it
before llama.cpp loads (a busy machine made spinning threads 18x slower here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
os.getloadavg = lambda: (50.0, 50.0, 50.0)          # a very busy machine
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
