"""The tune store never breaks a generation, and a stored configuration never overrides what the
user typed: a store that is not UTF-8, and an explicit --draft against a stored draft-free config."""

from __future__ import annotations

import json
import logging

import pytest

from llamaspec.tune import store
from llamaspec.tune.store import TunedConfig
from tune_fixtures import config_dir, model_pair  # noqa: F401 - fixtures

FAST = ("-n", "4", "-t", "1")
NOT_UTF8 = b"\xff\xfe garbage"


@pytest.fixture
def pair(model_pair):
    return model_pair


@pytest.fixture
def bad_store(config_dir):
    config_dir.mkdir()
    (config_dir / "tune.json").write_bytes(NOT_UTF8)
    return config_dir / "tune.json"


def _one_warning(r) -> None:
    assert "Traceback" not in r.stderr and "UnicodeDecodeError" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "tune.json" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning:") and "unreadable" in lines[0], r.stderr


def test_a_store_that_is_not_utf8_is_one_warning_for_run_and_batch(run_cli, pair, bad_store, tmp_path):
    t, d = pair
    r = run_cli("run", t, "--draft", d, "-p", "hi", "--temp", "0", "--json", *FAST)
    assert r.exit_code == 0, r.stderr
    assert r.json()["tuned"] is None and r.json()["spec_type"] == "draft-simple"
    _one_warning(r)
    inp, outp = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n")
    b = run_cli("batch", t, inp, "-o", outp, "--draft", d, "--temp", "0", *FAST)
    assert b.exit_code == 0, b.stderr
    assert json.loads(outp.read_text().splitlines()[0])["tuned"] is None


def test_a_store_that_is_not_utf8_can_be_shown_and_forgotten(run_cli, pair, bad_store):
    t, _ = pair
    s = run_cli("tune", "--show", "--json")
    assert s.exit_code == 0 and s.json()["entries"] == []
    _one_warning(s)
    one = run_cli("tune", "--forget", t)          # one model's entries: there are none to read
    assert one.exit_code == 0 and "forgot 0" in one.stdout
    _one_warning(one)
    r = run_cli("tune", "--forget")
    assert r.exit_code == 0, r.stderr
    assert "Traceback" not in r.stderr and not bad_store.exists()
    again = run_cli("run", t, "-p", "hi", "--temp", "0", "--json", *FAST)
    assert again.exit_code == 0 and "tune.json" not in again.stderr


def test_a_store_that_is_not_utf8_does_not_stop_a_generator(pair, bad_store, caplog):
    from llamaspec.api.generator import Generator

    t, d = pair
    with caplog.at_level(logging.WARNING, logger="llamaspec.tune"):
        with Generator(t, draft=d, temperature=0, threads=1, max_tokens=2) as g:
            assert g.tuned is None and g.options.spec_types == ["draft-simple"]
    assert [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    store.save(t, d, TunedConfig("ngram-mod"))          # saving over it keeps the bad bytes aside
    assert (bad_store.parent / "tune.json.bad").read_bytes() == NOT_UTF8
    assert store.lookup(t, d).spec_type == "ngram-mod"


def _run(run_cli, *args):
    r = run_cli("run", *args, "-p", "Tell me about the sea.", "--temp", "0", "--json", *FAST)
    assert r.exit_code == 0, r.stderr
    return r


def test_an_explicit_draft_is_used_even_when_the_stored_config_has_none(run_cli, pair):
    t, d = pair
    store.save(t, d, TunedConfig("ngram-mod", draft_max=7, ngram={"mod_n_match": 3}))
    r = _run(run_cli, t, "--draft", d, "--fixed-draft")   # drafts whatever the timings (tiny models)
    info = r.json()
    assert info["draft_model"] is not None and info["spec_type"] == "draft-simple"
    assert info["drafted"] > 0
    tuned = info["tuned"]
    assert tuned["spec_type"] == "ngram-mod" and tuned["applied"] == []
    assert tuned["overridden"] == ["spec-type", "draft-max", "mod-n-match"]
    assert "--draft" in tuned["reason"]
    human = run_cli("run", t, "--draft", d, "-p", "hi", "--temp", "0", *FAST)
    line = next(ln for ln in human.stderr.splitlines() if "tuned config" in ln)
    assert "not applied" in line and "--draft" in line


def test_an_explicit_draft_keeps_a_stored_config_that_uses_it_and_says_what_applied(run_cli, pair):
    t, d = pair
    store.save(t, d, TunedConfig("ngram-mod,draft-simple", draft_max=5, ngram={"mod_n_match": 3}))
    info = _run(run_cli, t, "--draft", d, "--draft-max", "3").json()
    assert info["spec_type"] == "ngram-mod,draft-simple" and info["draft_model"] is not None
    tuned = info["tuned"]
    assert tuned["applied"] == ["spec-type", "mod-n-match"] and tuned["overridden"] == ["draft-max"]
    human = run_cli("run", t, "--draft", d, "--draft-max", "3", "-p", "hi", "--temp", "0", *FAST)
    # one line: the configuration that runs, that tune chose it, and what the flags kept
    line = next(ln for ln in human.stderr.splitlines() if "as `llamaspec tune` chose" in ln)
    assert line.startswith("speculation: ngram-mod,draft-simple") and "your flags kept draft-max" in line


def test_generator_with_an_explicit_draft_keeps_it(pair):
    from llamaspec.api.generator import Generator

    t, d = pair
    store.save(t, d, TunedConfig("ngram-simple", draft_max=9))
    with Generator(t, draft=d, temperature=0, threads=1, max_tokens=4) as g:
        assert g.options.draft_path is not None and g.options.spec_types == ["draft-simple"]
        assert g.options.draft_max != 9 and g.tuned["applied"] == []
        assert g.generate("hi").stats["tuned"]["overridden"][0] == "spec-type"
