"""Per-command case counts of the hardening tests, for an issue's closing note.

Runs the modules below with pytest and prints each module's `CASES` counter (command -> cases that
passed through it) once the run ends. A report, not a test: the tests themselves assert every case.
Exit code: pytest's, or 1 if a command of the flag checks has fewer than five cases.

    python scripts/case_counts.py            # all of them (slow ones included)
    python scripts/case_counts.py tests/test_interrupts.py
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULES = ["test_chat_template_sandbox.py", "test_disk_full.py", "test_flags_hardening.py", "test_hub_hardening.py",
           "test_interrupts.py", "test_memory_fit.py", "test_registry_errors.py"]
# issue 13's bar for the flag checks: every command of these tried with at least five bad values
FLAG_COMMANDS = ("run", "batch", "bench", "tune")


class _Report:
    def __init__(self) -> None:
        self.counts: dict[str, Counter] = {}

    def pytest_sessionfinish(self, session) -> None:
        seen = {item.module for item in session.items}
        for mod in sorted(seen, key=lambda m: m.__name__):
            cases = getattr(mod, "CASES", None)
            if isinstance(cases, Counter):
                self.counts[mod.__name__] = cases


def main(argv: list[str]) -> int:
    paths = argv or [str(REPO / "tests" / m) for m in MODULES]
    report = _Report()
    code = pytest.main(["-q", "-m", "slow or not slow", "-p", "no:cacheprovider", *paths], plugins=[report])
    for name, cases in report.counts.items():
        print(f"{name}: {dict(cases)} total {sum(cases.values())}")
    flags = report.counts.get("test_flags_hardening")
    if flags is not None and min(flags[c] for c in FLAG_COMMANDS) < 5:
        print(f"flag cases below five for a command: {dict(flags)}", file=sys.stderr)
        return 1
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
