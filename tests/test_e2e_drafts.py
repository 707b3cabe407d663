"""A real draft model, end to end, as users reach it: `run --draft auto` finding the SmolLM2 Q4_1
beside its F16 target, `serve --draft`, and `chat --draft` in a pseudo-terminal. Each asserts the
draft model's OWN credited acceptance (draft-simple's count, not a chain's total, which
prompt-lookup and suffix can fill) and that the text is plain decoding's, or differs only at a
named near-tie of the target (engine_helpers.assert_lossless).

--fixed-draft in each: the adaptive controller rightly pauses a draft that does not pay on this
machine, and these tests are about the draft being found, wired and credited, not about when it pays.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect
import pytest

from child_process import HANG_GUARD_S, child_env, default_signals
from engine_helpers import assert_lossless, prompt_tokens
from llamaspec.runtime.llama import Model
from test_serve import Server

pytestmark = [pytest.mark.real, pytest.mark.slow]

# a counting answer: the Q4_1 draft of the same weights agrees with its F16 target nearly always
PROMPT = "Count from 1 to 30, separated by commas."
N = "48"
EPS = 0.25   # F16 target: batch-shape noise up to 0.08 in a logit (engine_helpers), a bug diverges far above
Q4_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def pair_folder(smollm2_f16, smollm2_q4, tmp_path) -> Path:
    """The F16 target and its Q4_1 sibling side by side, as a user keeps a model's quantizations."""
    d = tmp_path / "SmolLM2-135M-Instruct-GGUF"
    d.mkdir()
    os.symlink(smollm2_f16, d / "SmolLM2-135M-Instruct.F16.gguf")
    os.symlink(smollm2_q4, d / Q4_NAME)
    return d


def _judge(target_path: Path, prompt: list[int], plain: list[int], got: list[int], label: str) -> str:
    m = Model(target_path)
    try:
        return assert_lossless(m, prompt, plain, got, eps=EPS, label=label)
    finally:
        m.close()


def test_run_draft_auto_drafts_with_the_sibling_on_disk(run_cli, pair_folder, draft_pays):
    target = pair_folder / "SmolLM2-135M-Instruct.F16.gguf"
    draft_pays(target, pair_folder / Q4_NAME)   # on a CPU it is refused unless a run measured it paying
    common = ("run", target, "-p", PROMPT, "-n", N, "--temp", "0", "-t", "2", "--json")
    plain = run_cli(*common, "--spec-type", "none")
    auto = run_cli(*common, "--draft", "auto", "--fixed-draft")
    assert plain.exit_code == 0 and auto.exit_code == 0, auto.stderr
    got = auto.json()
    assert Path(got["draft_model"]).name == Q4_NAME and "draft-simple" in got["spec_type"].split(","), got["spec_type"]
    own = got["per_drafter"]["draft-simple"]
    assert own["drafted"] > 0 and own["accepted"] > 0, got["per_drafter"]
    m = Model(target)
    try:
        prompt = prompt_tokens(m, PROMPT)
    finally:
        m.close()
    assert got["n_prompt"] == len(prompt)   # the judge sees the prompt the CLI evaluated
    print(_judge(target, prompt, plain.json()["tokens"], got["tokens"], "run --draft auto"))


def _draft_simple_accepted(server: Server) -> float:
    text = server.metrics()["_text"]
    m = re.search(r'^llamaspec:drafter_draft_tokens_accepted_total\{drafter="draft-simple"\} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


def test_serve_with_a_draft_model_credits_it_and_answers_as_plain(smollm2_f16, smollm2_q4, tmp_path):
    prompt_text = "1, 2, 3, 4, 5,"
    answers = {}
    for label, args in (("plain", ("--spec-type", "none")), ("draft", ("--draft", str(smollm2_q4), "--fixed-draft"))):
        s = Server(smollm2_f16, "--parallel", "1", *args, tmp=tmp_path)
        try:
            r = s.client().completions.create(model="x", prompt=prompt_text, max_tokens=int(N))
            answers[label] = r
            if label == "draft":
                assert r.model_extra["timings"]["draft_n_accepted"] > 0, r.model_extra
                assert _draft_simple_accepted(s) > 0
        finally:
            assert s.stop() == 0, s.log.read_text()
    plain, got = answers["plain"].choices[0].text, answers["draft"].choices[0].text
    if plain != got:   # only a near-tie of the target may tell them apart
        m = Model(smollm2_f16)
        try:
            prompt = m.tokenize_prompt(prompt_text)
            a, b = (m.tokenize(t, add_special=False, parse_special=False) for t in (plain, got))
        finally:
            m.close()
        print(_judge(smollm2_f16, prompt, a, b, "serve --draft"))


FOOTER = re.compile(r"prompt \d+ tokens[^\r\n]*")   # a turn's footer line (cli/_chat_session.footer)
ACCEPTED = re.compile(r"\| ([\w+-]+): accepted (\d+)/(\d+)")


def test_chat_with_a_draft_model_reports_its_acceptance(smollm2_f16, smollm2_q4):
    """The draft model alone (--spec-type draft-simple): the footer's and /stats' counts are its own."""
    env = {**child_env(), "TERM": "dumb"}
    child = pexpect.spawn(sys.executable, ["-m", "llamaspec", "chat", str(smollm2_f16), "--draft", str(smollm2_q4),
                                           "--spec-type", "draft-simple", "--fixed-draft", "-t", "2", "--temp", "0",
                                           "-n", N],
                          encoding="utf-8", timeout=HANG_GUARD_S, env=env, dimensions=(50, 400),
                          preexec_fn=default_signals)
    try:
        child.expect_exact(">>> ")
        child.sendline(PROMPT)
        child.expect(FOOTER)
        footer = child.match.group(0)
        counts = ACCEPTED.search(footer)
        assert counts, footer   # "draft-simple: no drafts" when the draft model never drafted
        drafter, accepted, drafted = counts.group(1), int(counts.group(2)), int(counts.group(3))
        assert drafter == "draft-simple" and drafted > 0 and accepted > 0, footer
        child.expect_exact(">>> ")
        child.sendline("/stats")
        child.expect(r"drafted (\d+), accepted (\d+)")
        assert (int(child.match.group(1)), int(child.match.group(2))) == (drafted, accepted)
        child.expect_exact(">>> ")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
