"""Which draft goes with which target: llama.cpp's vocabulary rules (compat.py), the registry, GGUFs on disk, --draft auto."""
