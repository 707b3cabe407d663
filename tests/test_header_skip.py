"""A BPE model's merges are walked over, not decoded, when its header is read (gguf/header.py
SKIPPED_ARRAYS): the count is kept, and a file cut inside them is still refused as truncated."""

from __future__ import annotations

import pytest

from llamaspec.errors import ModelFileError
from llamaspec.gguf.header import SkippedStrings, read_file


def test_merges_are_counted_not_decoded(tiny_models):
    h = read_file(tiny_models["target"])
    merges = h.metadata["tokenizer.ggml.merges"]
    assert isinstance(merges, SkippedStrings) and len(merges) > 0 and list(merges) == []
    assert all(isinstance(t, str) for t in h.metadata["tokenizer.ggml.tokens"])   # tokens are read


def test_a_file_cut_inside_the_merges_is_truncated(tiny_models, tmp_path):
    data = tiny_models["target"].read_bytes()
    at = data.index(b"tokenizer.ggml.merges") + len(b"tokenizer.ggml.merges") + 4 + 4 + 8 + 40
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:at])
    with pytest.raises(ModelFileError, match="truncated"):
        read_file(cut)
