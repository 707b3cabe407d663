"""`llamaspec tune`: find the fastest speculative settings for a pair on this machine, store them,
and apply them when `run`, `batch` and `bench` are not told otherwise.

identity.py  what an entry is valid for (files, llama.cpp build, device)
store.py     tune.json in the user's config directory; `lookup(target, draft)` for the commands
measure.py   runs paired with plain decoding, the spread check (pure rules, made-up timings in tests)
sweep.py     the search (successive halving against plain decoding), testable without timing
calibrate.py the real runs (bench's run_mode on the calibration prompts)
flips.py     llama.cpp's batch noise measured on the target, and a flip judged against it
apply.py     a stored configuration merged with the settings a generation was given
"""
