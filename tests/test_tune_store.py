"""The tuned-config store: where it lives, identities, atomic writes, a corrupt file, applying it."""

from __future__ import annotations

import json
import logging
import os

import pytest

from llamaspec.speculative.options import NgramParams
from llamaspec.tune import store
from llamaspec.tune.apply import apply_tuned, tuned_summary
from llamaspec.tune.identity import EDGE, file_identity
from llamaspec.tune.store import TunedConfig
from tune_fixtures import config_dir  # noqa: F401 - fixture


@pytest.fixture
def pair(tmp_path):
    t, d = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    t.write_bytes(os.urandom(3 * EDGE))
    d.write_bytes(b"draft" * 100)
    return t, d


def test_config_dir_follows_the_override_then_xdg(monkeypatch, tmp_path, config_dir):
    assert store.store_path() == config_dir / "tune.json"
    monkeypatch.delenv(store.ENV_CONFIG_DIR)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert store.config_dir() == tmp_path / "xdg" / "llamaspec"


def test_file_identity_sees_any_change(pair):
    t, _ = pair
    a = file_identity(t)
    assert a.same_file(file_identity(t))
    st = t.stat()
    os.utime(t, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert not a.same_file(file_identity(t))
    b = file_identity(t)
    with open(t, "r+b") as f:          # the last MiB changes, size and mtime put back
        f.seek(-10, os.SEEK_END)
        f.write(b"0123456789")
    os.utime(t, ns=(st.st_atime_ns, b.mtime_ns))
    assert not b.same_file(file_identity(t))


def test_save_lookup_and_replace(pair):
    t, d = pair
    assert store.lookup(t, d) is None
    store.save(t, d, TunedConfig("ngram-mod", draft_max=48))
    got = store.lookup(t, d)
    assert got is not None and got.spec_type == "ngram-mod" and got.draft_max == 48 and got.created
    assert store.lookup(t, None) is None                       # another pair
    store.save(t, d, TunedConfig("draft-simple", draft_max=4))  # same key: replaced, not added
    assert len(store.read_entries()) == 1 and store.lookup(t, d).spec_type == "draft-simple"
    store.save(t, None, TunedConfig("ngram-simple"))
    assert len(store.read_entries()) == 2 and store.lookup(t, None).spec_type == "ngram-simple"


def test_a_modified_file_invalidates_its_entry(pair):
    t, d = pair
    store.save(t, d, TunedConfig("ngram-mod"))
    st = d.stat()
    os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert store.lookup(t, d) is None
    assert not store.is_current(store.read_entries()[0])


def test_corrupt_store_is_one_warning_and_empty(pair, config_dir, caplog):
    t, d = pair
    config_dir.mkdir()
    (config_dir / "tune.json").write_text('{"format": "llamaspec-tune", "entries": [')
    with caplog.at_level(logging.WARNING, logger="llamaspec.tune"):
        assert store.lookup(t, d) is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "unreadable" in warnings[0].getMessage()
    store.save(t, d, TunedConfig("ngram-mod"))                 # the bad file is kept aside
    assert (config_dir / "tune.json.bad").read_text().startswith('{"format"')
    assert store.lookup(t, d).spec_type == "ngram-mod"


def test_an_interrupted_write_leaves_the_old_store(pair, config_dir, monkeypatch):
    t, d = pair
    store.save(t, d, TunedConfig("ngram-mod"))
    before = (config_dir / "tune.json").read_text()

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.save(t, None, TunedConfig("ngram-simple"))
    assert (config_dir / "tune.json").read_text() == before
    assert sorted(p.name for p in config_dir.iterdir()) == ["tune.json"]   # no temporary file left


def test_forget_one_model_or_all(pair, tmp_path):
    t, d = pair
    other = tmp_path / "other.gguf"
    other.write_bytes(b"x" * 10)
    store.save(t, d, TunedConfig("ngram-mod"))
    store.save(other, None, TunedConfig("ngram-simple"))
    assert [e.target.path for e in store.forget(t)] == [str(t.resolve())]
    assert store.lookup(other, None) is not None and store.lookup(t, d) is None
    assert len(store.forget()) == 1 and not store.store_path().exists()


def _apply(t, d, **kw):
    args = dict(spec_types=["draft-simple"], spec_type_given=False, draft_given=True, draft_max=None,
                draft_p_min=0.0, ngram=NgramParams())
    args.update(kw)
    return apply_tuned(t, d, **args)


def test_apply_flags_win_per_setting(pair):
    t, d = pair
    store.save(t, d, TunedConfig("ngram-mod,draft-simple", draft_max=24, draft_p_min=0.5,
                                 ngram={"mod_n_match": 12}))
    a = _apply(t, d)
    assert a.spec_types == ["ngram-mod", "draft-simple"] and a.uses_draft
    assert (a.draft_max, a.draft_p_min, a.ngram.mod_n_match, a.info["overridden"]) == (24, 0.5, 12, [])
    b = _apply(t, d, draft_max=5, ngram=NgramParams(mod_n_match=3))
    assert (b.draft_max, b.draft_p_min, b.ngram.mod_n_match) == (5, 0.5, 3)
    assert b.info["overridden"] == ["draft-max", "mod-n-match"]
    assert b.info["applied"] == ["spec-type", "draft-p-min"]
    assert "overridden by flags: draft-max, mod-n-match" in tuned_summary(b.info)
    assert _apply(t, d, spec_types=["ngram-simple", "draft-simple"], spec_type_given=True) is None
    same = _apply(t, d, spec_types=["ngram-mod", "draft-simple"], spec_type_given=True)
    assert same is not None and same.draft_max == 24


def test_apply_falls_back_to_the_targets_own_tuning_for_an_auto_draft(pair):
    t, d = pair
    store.save(t, None, TunedConfig("ngram-simple", draft_max=16))
    assert _apply(t, d) is None                                   # the user named this draft
    a = _apply(t, d, draft_given=False)                          # --draft auto chose it
    assert a.spec_types == ["ngram-simple"] and not a.uses_draft and a.draft_max == 16
    assert "tuned config from " in tuned_summary(a.info) and "spec ngram-simple, draft-max 16" in tuned_summary(a.info)
