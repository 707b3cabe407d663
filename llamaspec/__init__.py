"""llamaspec: speculative decoding for local GGUF models, on llama.cpp via llama-cpp-python."""

__version__ = "0.1.0"
