"""llamaspec: speculative decoding for local GGUF models, on llama.cpp via llama-cpp-python.

The Python API for scripts is `Generator` (llamaspec/generator.py), imported on first use so that
`import llamaspec` and `llamaspec --help` stay light (no llama_cpp).
"""

from llamaspec._version import __version__

__all__ = ["__version__", "Generator", "Result", "Request"]


def __getattr__(name: str):
    if name in ("Generator", "Result", "Request"):
        from llamaspec import generator

        return getattr(generator, name)
    raise AttributeError(f"module 'llamaspec' has no attribute {name!r}")
