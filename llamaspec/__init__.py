"""llamaspec: speculative decoding for local GGUF models, on llama.cpp via llama-cpp-python."""

from llamaspec._version import __version__

__all__ = ["__version__"]
