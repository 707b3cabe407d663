"""Test models for llamaspec's own tests: tiny generated GGUFs and the real PyPI-packaged models.

Nothing here is imported by the CLI; `llama_cpp` is only imported inside functions.
"""

from llamaspec.testing.tiny_models import (
    GENERATOR_VERSION,
    SET_NAMES,
    VARIANT_COMPATIBLE,
    VARIANT_KINDS,
    Vocab,
    bpe_vocab,
    make_tiny_set,
    other_bpe_vocab,
    spm_vocab,
    vocab_variant,
    write_llama_model,
    write_mtp_model,
)

__all__ = [
    "GENERATOR_VERSION",
    "SET_NAMES",
    "VARIANT_COMPATIBLE",
    "VARIANT_KINDS",
    "Vocab",
    "bpe_vocab",
    "make_tiny_set",
    "other_bpe_vocab",
    "spm_vocab",
    "vocab_variant",
    "write_llama_model",
    "write_mtp_model",
]
