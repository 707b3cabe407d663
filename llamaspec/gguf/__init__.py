"""GGUF files without llama.cpp: the incremental header reader (header.py) and vocabulary facts (vocab.py)."""
