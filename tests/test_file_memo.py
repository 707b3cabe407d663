"""Headers and pair verdicts kept per file version (gguf/file_memo.py): a second run in a folder
reads no GGUF again, and any change to a file (size or mtime) is read afresh."""

from __future__ import annotations

import os
import shutil

import pytest

from llamaspec.gguf import file_memo, header as gguf_header
from llamaspec.pairing import discovery


@pytest.fixture
def counted(monkeypatch):
    calls: list[str] = []
    real = gguf_header._read_path

    def spy(p):
        calls.append(str(p))
        return real(p)

    monkeypatch.setattr(gguf_header, "_read_path", spy)
    monkeypatch.setattr(file_memo, "_IN_PROCESS", {})   # only the on-disk store carries over
    return calls


def test_a_header_is_parsed_once_per_file_version(tmp_path, smollm2_q4, counted):
    model = tmp_path / "m.gguf"
    shutil.copyfile(smollm2_q4, model)
    first = gguf_header.read_file(model)
    file_memo._IN_PROCESS.clear()   # a new process: read from the store
    again = gguf_header.read_file(model)
    assert counted == [str(model)]
    assert again.metadata == first.metadata and again.tensors == first.tensors
    assert any(file_memo.memo_dir().glob("*.pkl"))

    os.utime(model, ns=(1, 1))   # touched (or replaced by another quant of the same size): read again
    gguf_header.read_file(model)
    assert counted == [str(model)] * 2


def test_a_symlinks_header_names_the_link_not_its_target(tmp_path, smollm2_q4, counted):
    """Discovery looks for siblings in header.source's folder: a link in another folder must
    not inherit the real file's path from the memo."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "m.gguf").symlink_to(smollm2_q4)
    (b / "m.gguf").symlink_to(smollm2_q4)
    assert gguf_header.read_file(a / "m.gguf").source == str(a / "m.gguf")
    assert gguf_header.read_file(b / "m.gguf").source == str(b / "m.gguf")
    assert len(counted) == 1


def test_a_damaged_store_entry_is_recomputed(tmp_path, smollm2_q4, counted):
    model = tmp_path / "m.gguf"
    model.symlink_to(smollm2_q4)
    gguf_header.read_file(model)
    for entry in file_memo.memo_dir().glob("*.pkl"):
        entry.write_bytes(b"not a pickle")
    file_memo._IN_PROCESS.clear()
    assert gguf_header.read_file(model).metadata["general.architecture"] == "llama"
    assert len(counted) == 2


def test_errors_are_not_kept(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 10)
    for _ in range(2):
        with pytest.raises(Exception) as e:
            gguf_header.read_file(bad)
        assert "bad.gguf" in str(e.value)
    assert not any(file_memo.memo_dir().glob("*.pkl"))


def test_the_pair_verdict_is_kept_and_follows_the_files(tmp_path, smollm2_f16, smollm2_q4, monkeypatch):
    (tmp_path / "f16.gguf").symlink_to(smollm2_f16)
    shutil.copyfile(smollm2_q4, tmp_path / "q4.gguf")
    compared: list[str] = []
    real = discovery.check_headers
    monkeypatch.setattr(discovery, "check_headers", lambda t, h, **kw: compared.append(h.source) or real(t, h, **kw))
    target = gguf_header.read_file(tmp_path / "f16.gguf")

    def verdicts():
        file_memo._IN_PROCESS.clear()
        cands = discovery.scan(target, [discovery.Root(tmp_path, "beside")], target_path=target.source)
        return {c.path.name: (c.verdict.compatible if c.verdict else None, c.skipped) for c in cands}

    first = verdicts()
    assert first["q4.gguf"] == (True, None) and len(compared) == 1
    assert verdicts() == first and len(compared) == 1   # kept: nothing compared again
    os.truncate(tmp_path / "q4.gguf", os.path.getsize(tmp_path / "q4.gguf") // 2)   # its data cut off
    cut = verdicts()
    assert len(compared) == 2 and cut["q4.gguf"][1]   # read again, and now skipped: its data is missing


def test_off_switch(tmp_path, smollm2_q4, counted, monkeypatch):
    monkeypatch.setenv(file_memo.ENV, "0")
    gguf_header.read_file(smollm2_q4)
    file_memo._IN_PROCESS.clear()
    gguf_header.read_file(smollm2_q4)
    assert len(counted) == 2 and file_memo.memo_dir() is None


def test_the_grammar_drafters_vocabulary_is_read_back_not_rebuilt(smollm2_f16, monkeypatch, tmp_path):
    """grammar_jump's tables (a token per byte, the EOG tokens, what longer tokens extend) come
    from every token's text: made once per model file, then read back (0.2 s -> ~15 ms on
    SmolLM2), the same tables."""
    from llamaspec.runtime.llama import Model
    from llamaspec.speculative.drafters import grammar_jump

    monkeypatch.setenv(file_memo.ENV, str(tmp_path / "memo"))
    monkeypatch.setattr(file_memo, "_IN_PROCESS", {})
    model = Model(smollm2_f16)
    try:
        first = grammar_jump._Vocab(model)
        file_memo._IN_PROCESS.clear()   # a new process
        texts: list[int] = []
        real = Model.piece
        monkeypatch.setattr(Model, "piece", lambda self, t: texts.append(t) or real(self, t))
        again = grammar_jump._Vocab(model)
        assert texts == []                            # no token's text rendered again
        assert (again.tok_of, again.eog, again.extends) == (first.tok_of, first.eog, first.extends)
        assert again.extends[b"ab"] and len(first.extends) > 10_000
    finally:
        model.close()
