"""The default's draft choice kept while nothing it read has changed (pairing/choice_memo.py): a
second run takes it without the pairing code, and a change to any place or file the choice read
(a draft put beside the target, a file replaced in place, a stored measurement) makes it again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from llamaspec.api.resolve import resolve
from llamaspec.pairing import autodraft, choice_memo


def _put(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)
    return dst


@pytest.fixture
def choices(monkeypatch, tmp_path):
    """Counts the choices actually made (autodraft.choose_draft calls); the memo in a folder of
    the test's own."""
    monkeypatch.setenv(choice_memo.ENV, str(tmp_path / "choices"))
    made = []
    real = autodraft.choose_draft

    def counted(*args, **kwargs):
        made.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(autodraft, "choose_draft", counted)
    return made


def test_a_second_default_run_takes_the_kept_choice(run_cli, tiny_models, tmp_path, choices):
    target = _put(tiny_models["target"], tmp_path / "m" / "target.gguf")
    first = run_cli("run", target, "-p", "hi", "-n", "4", "--temp", "0", "--json")
    second = run_cli("run", target, "-p", "hi", "-n", "4", "--temp", "0", "--json")
    assert first.exit_code == 0 and second.exit_code == 0, second.stderr
    assert len(choices) == 1                      # the second run did not look again
    assert second.json()["spec_type"] == first.json()["spec_type"] == "prompt-lookup,suffix"
    assert second.stderr.splitlines()[0] == first.stderr.splitlines()[0]
    assert second.stderr.splitlines()[0].startswith("speculation: prompt-lookup drafting from the text itself")
    # an explicit --spec-type, or --draft auto (which may download), never reads the memo
    run_cli("run", target, "--draft", "auto", "--offline", "-p", "hi", "-n", "2", "--temp", "0")
    assert len(choices) == 2


def test_a_draft_put_beside_the_target_is_seen_by_the_next_run(run_cli, tiny_models, tmp_path, choices, draft_pays):
    target = _put(tiny_models["target"], tmp_path / "m" / "target.gguf")
    draft_pays(target, tiny_models["draft"])
    alone = run_cli("run", target, "-p", "hi", "-n", "4", "--temp", "0", "--json")
    assert alone.json()["draft_model"] is None
    _put(tiny_models["draft"], tmp_path / "m" / "draft.gguf")
    beside = run_cli("run", target, "-p", "hi", "-n", "4", "--temp", "0", "--json")
    assert beside.exit_code == 0, beside.stderr
    assert Path(beside.json()["draft_model"]).name == "draft.gguf"
    assert len(choices) == 2


def test_a_stored_measurement_and_a_file_replaced_in_place_make_the_choice_again(tiny_models, tmp_path, choices,
                                                                                 draft_pays):
    folder = tmp_path / "m"
    target = _put(tiny_models["target"], folder / "target.gguf")
    draft = folder / "draft.gguf"
    draft.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny_models["draft"], draft)        # a copy: replaced in place below
    refused = resolve(str(target), None, None)
    assert refused.draft_path is None and any("found but not expected to pay" in n for n in refused.notes)
    assert resolve(str(target), None, None).notes == refused.notes and len(choices) == 1

    draft_pays(target, draft)                            # the store changed: chosen again, and taken
    taken = resolve(str(target), None, None)
    assert len(choices) == 2 and taken.draft_path is not None and Path(taken.draft_path).name == "draft.gguf"

    st, folder_stamp = draft.stat(), folder.stat().st_mtime_ns
    with open(draft, "r+b") as f:                       # rewritten in place: the folder's stamp stays
        f.write(b"XXXX")
    os.utime(draft, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert folder.stat().st_mtime_ns == folder_stamp
    broken = resolve(str(target), None, None)
    assert len(choices) == 3 and broken.draft_path is None


def test_the_memo_can_be_turned_off(tiny_models, tmp_path, choices, monkeypatch):
    monkeypatch.setenv(choice_memo.ENV, "0")
    target = _put(tiny_models["target"], tmp_path / "m" / "target.gguf")
    for _ in range(2):
        resolve(str(target), None, None)
    assert len(choices) == 2


def test_a_damaged_entry_is_chosen_again(tiny_models, tmp_path, choices):
    target = _put(tiny_models["target"], tmp_path / "m" / "target.gguf")
    first = resolve(str(target), None, None)
    for entry in (tmp_path / "choices").glob("*.pkl"):
        entry.write_bytes(b"not a pickle")
    again = resolve(str(target), None, None)
    assert len(choices) == 2 and again.spec_types == first.spec_types and again.notes == first.notes
