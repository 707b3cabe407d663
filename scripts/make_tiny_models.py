#!/usr/bin/env python3
"""Write the tiny test GGUF set into OUTDIR and print name<TAB>path for each model.

    python scripts/make_tiny_models.py OUTDIR [--force]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from llamaspec.testing.tiny_models import GENERATOR_VERSION, make_tiny_set  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--force", action="store_true", help="rewrite even if a cached set of this version exists")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    paths = make_tiny_set(args.outdir, force=args.force)
    for name, path in paths.items():
        print(f"{name}\t{path}")
    print(f"tiny set v{GENERATOR_VERSION}: {len(paths)} models in {time.perf_counter() - t0:.2f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
