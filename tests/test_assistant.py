"""draft-mtp from a separate Gemma 4 assistant GGUF (llamaspec/testing/tiny_assistant.py): the
assistant's MTP layers attend on the target's KV cache, through llama.cpp's ctx_other link.

Everything goes through what users run: `llamaspec run` (CliRunner-style, in process) and
`llamaspec.Generator`; greedy output must be token for token plain decoding's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llamaspec.pairing import autodraft
from llamaspec.testing.tiny_assistant import make_assistant_set

PROMPT = "the cat sat on the mat and the dog"


@pytest.fixture(scope="session")
def asst(test_models_dir) -> dict[str, Path]:
    return make_assistant_set(test_models_dir / "tiny-assistant-v1")


def _run(run_cli, *args):
    r = run_cli("run", *args, "--json", "-t", "1")
    assert r.exit_code == 0, r.stderr
    return r.json()


def _common(asst, n=48):
    return (str(asst["gemma4_target"]), "-p", PROMPT, "-n", str(n), "--temp", "0", "--raw")


def _link(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)
    return dst


def test_assistant_drafts_and_output_is_plain_decoding(run_cli, asst):
    plain = _run(run_cli, *_common(asst), "--spec-type", "none")
    # --fixed-draft: whether drafting pays is the adaptive controller's call, by timings that mean
    # little on tiny models (on a loaded machine it paused drafting after 6 tokens)
    got = _run(run_cli, *_common(asst), "--spec-type", "draft-mtp", "--draft", str(asst["gemma4_assistant"]),
               "--fixed-draft")
    assert got["tokens"] == plain["tokens"] and len(plain["tokens"]) == 48
    assert got["spec_type"] == "draft-mtp" and got["draft_model"] == str(asst["gemma4_assistant"])
    # aligned assistant: its drafts are the target's next tokens almost always
    assert got["drafted"] >= 10 and got["acceptance"] >= 0.7, got
    assert got["per_drafter"]["draft-mtp"]["accepted"] == got["accepted"]


def test_alias_mtp_and_a_random_assistant_stay_lossless(run_cli, asst):
    plain = _run(run_cli, *_common(asst, 32), "--spec-type", "none")
    for spec, draft in (("mtp", "gemma4_assistant"), ("draft-mtp", "gemma4_assistant_random")):
        got = _run(run_cli, *_common(asst, 32), "--spec-type", spec, "--draft", str(asst[draft]))
        assert got["tokens"] == plain["tokens"], (spec, draft)
        assert got["drafted"] > 0
    # with the --fixed-draft length the random assistant keeps drafting; few drafts survive
    got = _run(run_cli, *_common(asst, 32), "--spec-type", "draft-mtp", "--draft",
               str(asst["gemma4_assistant_random"]), "--fixed-draft", "--draft-max", "4")
    assert got["tokens"] == plain["tokens"] and got["drafted"] >= 8 and got["acceptance"] < 0.5


def test_generator_api_with_an_assistant(asst):
    from llamaspec import Generator

    with Generator(asst["gemma4_target"], spec_type="none", temperature=0, max_tokens=40, threads=1) as g:
        plain = g.generate(PROMPT).tokens
    with Generator(asst["gemma4_target"], draft=asst["gemma4_assistant"], spec_type="draft-mtp",
                   temperature=0, max_tokens=40, threads=1) as g:
        assert g.spec_label == "draft-mtp"
        res = g.generate(PROMPT)
        again = g.generate(PROMPT)   # a second request on the same contexts
    assert res.tokens == plain == again.tokens
    assert res.stats["accepted"] > 0


def test_assistant_that_does_not_fit_is_refused_in_one_line(run_cli, asst, tiny_models):
    # trained for a 128-wide target: the vocabulary matches, the hidden size does not
    r = run_cli("run", *_common(asst, 4), "--spec-type", "draft-mtp", "--draft", str(asst["gemma4_assistant_wide"]))
    assert r.exit_code != 0 and "hidden size" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2
    # --force-draft skips the vocabulary refusal, never the shape check (llama.cpp would abort)
    r = run_cli("run", *_common(asst, 4), "--spec-type", "draft-mtp", "--draft", str(asst["gemma4_assistant_wide"]),
                "--force-draft")
    assert r.exit_code == 2 and "does not fit" in r.stderr and "hidden_size" in r.stderr
    # an assistant for a llama target: not a gemma4 target
    r = run_cli("run", str(tiny_models["target"]), "-p", "x", "-n", "2", "--spec-type", "draft-mtp",
                "--draft", str(asst["gemma4_assistant"]), "--force-draft")
    assert r.exit_code == 2 and "target_arch" in r.stderr and "Traceback" not in r.stderr


def test_check_and_inspect_recognise_the_assistant(run_cli, asst):
    info = run_cli("inspect", asst["gemma4_assistant"], "--json").json()
    assert info["draft"]["kind"] == "draft-mtp" and info["draft"]["target_architecture"] == "gemma4"
    v = run_cli("check", asst["gemma4_target"], asst["gemma4_assistant"], "--json")
    assert v.exit_code == 0
    rules = {x["rule"]: x for x in v.json()["rules"]}
    assert rules["kv_layout"]["passed"] and rules["target_arch"]["passed"] and rules["hidden_size"]["passed"]
    assert v.json()["draft_kind"] == "draft-mtp"


def test_auto_picks_the_assistant_beside_the_target(asst, tmp_path, isolated_home):
    repo = tmp_path / "gemma-4-tiny-GGUF"
    target = _link(asst["gemma4_target"], repo / "gemma-4-tiny-F32.gguf")
    _link(asst["gemma4_assistant_wide"], repo / "a-wide-assistant.gguf")     # does not fit: passed over
    side = _link(asst["gemma4_assistant"], repo / "mtp-gemma-4-tiny-F32.gguf")
    c = autodraft.choose_draft(str(target), offline=True, default_dirs=False)
    assert (c.kind, c.path, c.source) == ("draft-mtp", side, "sidecar")
    assert c.reason.startswith("Gemma 4 assistant mtp-gemma-4-tiny-F32.gguf beside the target"), c.reason


def test_run_draft_auto_uses_the_assistant_beside_the_target(run_cli, asst, tmp_path, isolated_home):
    repo = tmp_path / "gemma-4-tiny-GGUF"
    target = _link(asst["gemma4_target"], repo / "gemma-4-tiny-F32.gguf")
    _link(asst["gemma4_assistant"], repo / "mtp-gemma-4-tiny-F32.gguf")
    plain = _run(run_cli, str(target), "-p", PROMPT, "-n", "32", "--temp", "0", "--raw", "--spec-type", "none")
    got = _run(run_cli, str(target), "-p", PROMPT, "-n", "32", "--temp", "0", "--raw", "--draft", "auto")
    assert got["spec_type"] == "draft-mtp" and got["tokens"] == plain["tokens"] and got["accepted"] > 0
