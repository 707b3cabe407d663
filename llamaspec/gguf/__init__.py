"""GGUF files without llama.cpp: the incremental header reader (header.py, files and ranged reads), fast memory-mapped peeks for scanning many files (peek.py) and vocabulary facts (vocab.py)."""
