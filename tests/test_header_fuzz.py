"""Property-based tests of the GGUF header readers (gguf/header.py and gguf/peek.py's light reader).

Random truncations, byte flips and splices of a valid header, and random headers built from the
GGUF grammar: each must parse or raise ModelFileError (never another exception), within a memory
bound (and a hang guard: speed belongs to benchmarks). Deterministic (derandomize) and a fixed number of examples, for CI.
"""

from __future__ import annotations

import io
import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamaspec.errors import ModelFileError
from llamaspec.gguf import peek
from llamaspec.gguf.header import read_header
from llamaspec.testing.corrupt_gguf import gstr, parse, value_raw

HANG_GUARD_S = 30              # a hang guard per example, not a speed bound
MEMORY_BOUND = 64 << 20        # tracemalloc peak per example
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def valid_header(tiny_models) -> bytes:
    """The tiny draft's header and tensor infos (no tensor data: the readers stop before it)."""
    buf = Path(tiny_models["draft"]).read_bytes()
    p = parse(buf)
    return buf[:next(f for f in p.fields if f.label == "padding").start]


def _bounded(data: bytes, tmp: Path | None = None, claimed_size: int | None = None) -> str:
    """Parse `data` with both readers inside the bounds; "ok" or "refused"."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        try:
            read_header(io.BytesIO(data), source="fuzz", chunk=4096, file_size=len(data))
            outcome = "ok"
        except ModelFileError:
            outcome = "refused"
        try:  # the same bytes with the size unknown (a Hub stream)
            read_header(io.BytesIO(data), source="fuzz", chunk=4096)
        except ModelFileError:
            pass
        if tmp is not None and data:
            f = tmp / "fuzz.gguf"
            f.write_bytes(data)
            peek._peek_cache.clear()
            peek.peek(f)  # None or a Peek, never an exception
            target = peek.TargetTokens(b"", [], [])
            peek.light_header(f, target)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - t0
    assert elapsed < HANG_GUARD_S, f"{elapsed:.2f} s: a reader looping on a malformed header?"
    assert peak < MEMORY_BOUND, f"peak {peak / 2**20:.0f} MiB"
    return outcome


# ---- mutations of a valid header ------------------------------------------------------------------

_u64s = st.sampled_from([0, 1, 2, 255, 1 << 16, (1 << 31) - 1, 1 << 31, 1 << 32, 1 << 40, (1 << 63), (1 << 64) - 1])


@st.composite
def mutated(draw, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "u64", "u32", "cut", "splice", "delete"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "u64":
            data[at:at + 8] = struct.pack("<Q", draw(_u64s))
        elif kind == "u32":
            data[at:at + 4] = struct.pack("<I", draw(st.integers(0, (1 << 32) - 1)))
        elif kind == "cut":
            del data[at:]
        elif kind == "splice":
            data[at:at] = draw(st.binary(max_size=32))
        else:
            del data[at:at + draw(st.integers(1, 64))]
    return bytes(data)


def test_mutated_headers_parse_or_refuse(valid_header, tmp_path):
    outcomes = []

    @FUZZ
    @given(data=mutated(valid_header))
    def check(data):
        outcomes.append(_bounded(data, tmp_path))

    assert _bounded(valid_header, tmp_path) == "ok"
    check()
    assert "refused" in outcomes  # the mutations do reach the error paths


# ---- headers from the grammar ----------------------------------------------------------------------

_keys = st.one_of(st.sampled_from(["general.architecture", "general.alignment", "tokenizer.ggml.tokens",
                                   "tokenizer.ggml.model", "llama.block_count", "general.name"]),
                  st.binary(max_size=12))


@st.composite
def kv(draw) -> bytes:
    vtype = draw(st.integers(0, 14))
    key = draw(_keys)
    if vtype in (0, 1, 2, 3, 4, 5, 7, 10, 11):
        raw = value_raw(vtype, draw(st.integers(0, 1)))
    elif vtype in (6, 12):
        raw = value_raw(vtype, 1.5)
    elif vtype == 8:
        raw = gstr(draw(st.binary(max_size=16)))
    elif vtype == 9:
        etype = draw(st.integers(0, 13))
        count = draw(st.one_of(st.integers(0, 4), _u64s))
        raw = struct.pack("<IQ", etype, count) + draw(st.binary(max_size=48))
    else:
        raw = draw(st.binary(max_size=8))
    return gstr(key) + struct.pack("<I", vtype) + raw


@st.composite
def tensor_info(draw) -> bytes:
    dims = draw(st.lists(st.one_of(st.integers(0, 64), _u64s), max_size=5))
    n_dims = draw(st.one_of(st.just(len(dims)), st.integers(0, 12)))
    return (gstr(draw(st.binary(max_size=12))) + struct.pack("<I", n_dims) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", draw(st.integers(0, 45)), draw(st.one_of(st.integers(0, 1024), _u64s))))


@st.composite
def grammar_file(draw) -> bytes:
    kvs = draw(st.lists(kv(), max_size=6))
    infos = draw(st.lists(tensor_info(), max_size=4))
    n_kv = draw(st.one_of(st.just(len(kvs)), _u64s))
    n_tensors = draw(st.one_of(st.just(len(infos)), _u64s))
    version = draw(st.sampled_from([2, 3, 3, 3, 1, 4]))
    return (b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(kvs) + b"".join(infos)
            + draw(st.binary(max_size=64)))


def test_grammar_headers_parse_or_refuse(tmp_path):
    outcomes = []

    @FUZZ
    @given(data=grammar_file())
    def check(data):
        outcomes.append(_bounded(data, tmp_path))

    check()
    assert "ok" in outcomes and "refused" in outcomes
