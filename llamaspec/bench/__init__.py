"""Measurement: plain vs speculative decoding side by side (runner.py), several targets, drafts and
prompts (suite.py), the theoretical speedup (theory.py), the machine's copy-drafting bound (bound.py),
llama.cpp's own tools (native.py), prompt presets (prompts.py) and the result types (results.py).

Above speculative/ and runtime/; tune/ sweeps with this runner; cli/ renders the results. The
runner's public names are re-exported here, so `from llamaspec.bench import run_bench` works.
"""

from llamaspec.bench.runner import *  # noqa: F401,F403
from llamaspec.bench.runner import __all__  # noqa: F401
