"""`llamaspec chat`: an interactive chat on the model's template, history and KV prefix kept across
turns. The CLI is driven through a pseudo-terminal (pexpect) on the real SmolLM2; the pure helpers
(history trimming, multi-line input) are tested alone."""

from __future__ import annotations

import pytest

from llamaspec.api.generator import Generator


@pytest.mark.real
def test_next_turn_reuses_the_cached_prefix(smollm2_q4):
    """The engine reports how many prompt tokens came from the KV cache: a second turn evaluates only
    what the first did not leave there (n_prompt_cached), a first turn nothing cached."""
    with Generator(smollm2_q4, spec_type="none", temperature=0, max_tokens=8, threads=1, ctx_size=512) as g:
        turn1 = [{"role": "user", "content": "Name a colour."}]
        r1 = g.generate(turn1)
        assert r1.stats["n_prompt_cached"] == 0
        turn2 = turn1 + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "Another one."}]
        r2 = g.generate(turn2)
        assert r2.n_prompt == len(g.tokenize(turn2))
        # everything of turn 1 that went into the KV cache (its prompt at least) is reused
        assert r1.n_prompt <= r2.stats["n_prompt_cached"] < r2.n_prompt


# ---- pure helpers ---------------------------------------------------------------------------------

from llamaspec.cli._chat_session import MultiLine, Totals, answer_room, fit_history, footer  # noqa: E402


def test_multiline_input_as_ollama():
    m = MultiLine()
    assert m.feed("hello") == "hello" and not m.active
    assert m.feed('"""one line"""') == "one line"
    assert m.feed('"""') is None and m.active
    assert m.feed("first") is None and m.feed("") is None
    assert m.feed('last"""') == "first\n\nlast" and not m.active
    assert m.feed('"""start') is None and m.feed('end"""') == "start\nend"
    m.feed('"""abandoned')
    m.cancel()   # Ctrl-C inside a multi-line message
    assert not m.active and m.feed("/bye") == "/bye"


def _msgs(*roles_contents):
    return [{"role": r, "content": c} for r, c in roles_contents]


def test_fit_history_drops_oldest_turns_keeps_system_and_current():
    convo = _msgs(("system", "S"), ("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2"),
                  ("user", "u3"))
    count = len   # one "token" per message
    assert fit_history(convo, count, 6) == (convo, 0)
    kept, dropped = fit_history(convo, count, 5)
    assert dropped == 1 and kept == [convo[0]] + convo[3:]
    kept, dropped = fit_history(convo, count, 1)   # never below system + the current message
    assert dropped == 2 and kept == [convo[0], convo[5]]
    no_system = convo[1:]
    kept, dropped = fit_history(no_system, count, 3)
    assert dropped == 1 and kept == no_system[2:]
    # a turn is a user message and every reply up to the next one
    odd = _msgs(("user", "u1"), ("assistant", "a"), ("assistant", "b"), ("user", "u2"))
    assert fit_history(odd, count, 2) == (odd[3:], 1)


def test_answer_room_leaves_room_for_a_question():
    assert answer_room(4096, 256) == 256
    assert answer_room(256, 1000) == 128
    assert answer_room(256, 0) == 1


def _info(**kw):
    base = {"n_prompt": 80, "n_prompt_cached": 60, "n_generated": 24, "tokens_per_second": 30.0,
            "gen_seconds": 0.8, "prompt_seconds": 0.1, "drafted": 10, "accepted": 4, "acceptance": 0.4,
            "spec_type": "prompt-lookup", "stop_reason": "eos",
            "per_drafter": {"prompt-lookup": {"drafted": 10}, "draft-simple": {"drafted": 0}}}
    return {**base, **kw}


def test_footer_reports_the_tokens_this_turn_evaluated():
    line = footer(_info())
    assert line.startswith("prompt 20 tokens (60 cached) | 24 tokens, 30.0 tok/s")
    assert "prompt-lookup: accepted 4/10 (40%)" in line and "stop" not in line
    assert "stop: length" in footer(_info(stop_reason="length"))
    assert "no speculation" in footer(_info(drafted=0, accepted=0, spec_type="none"))
    assert footer(_info(n_prompt_cached=0)).startswith("prompt 80 tokens |")
    t = Totals()
    t.add(_info())
    t.add(_info(n_prompt_cached=0))
    assert t.turns == 2 and t.prompt_evaluated == 100 and t.prompt_cached == 60 and t.generated == 48
    assert "drafted 20, accepted 8 (40%)" in t.lines()


# ---- the command, through a pseudo-terminal ---------------------------------------------------------

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pexpect  # noqa: E402

from child_process import default_signals  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
FOOTER = re.compile(r"prompt (\d+) tokens(?: \((\d+) cached\))? \| (\d+) tokens, [\d.]+ tok/s[^\r\n]*")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
FLAGS = ("-t", "1", "--temp", "0", "-n", "24")


def _spawn(*args):
    env = {**os.environ, "TERM": "dumb", "PYTHONPATH": str(REPO_ROOT)}
    child = pexpect.spawn(sys.executable, ["-m", "llamaspec", *map(str, args)], encoding="utf-8", timeout=180,
                          env=env, dimensions=(50, 400), preexec_fn=default_signals)
    child.expect_exact(">>> ")
    return child


def _turn(child, text: str) -> tuple[int, int, str]:
    """Send a message; (prompt tokens evaluated, cached, everything printed) from its footer."""
    child.sendline(text)
    child.expect(FOOTER)
    printed = ANSI.sub("", child.before + child.after)
    child.expect_exact(">>> ")
    found = FOOTER.search(printed)
    return int(found.group(1)), int(found.group(2) or 0), printed


def _leave(child, how: str = "/exit") -> int:
    if how == "eof":
        child.sendeof()
    else:
        child.sendline(how)
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


@pytest.mark.real
@pytest.mark.slow
def test_two_turns_evaluate_only_new_tokens_save_and_exit(smollm2_q4, tmp_path):
    child = _spawn("chat", smollm2_q4, *FLAGS)
    q1, q2 = "What is the capital of France?", "And of Germany?"
    n1, cached1, _ = _turn(child, q1)
    n2, cached2, _ = _turn(child, q2)
    saved = tmp_path / "chat.json"
    child.sendline(f"/save {saved}")
    child.expect_exact(">>> ")
    assert _leave(child) == 0
    messages = json.loads(saved.read_text())
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == q1 and messages[2]["content"] == q2 and messages[1]["content"]

    with Generator(smollm2_q4, spec_type="none", threads=1, ctx_size=256) as g:
        first, full = len(g.tokenize(messages[:1])), len(g.tokenize(messages[:3]))
    assert (n1, cached1) == (first, 0)
    # turn 2 sends the whole conversation but evaluates only what turn 1 did not leave in the cache
    assert n2 + cached2 == full and cached2 >= first and n2 < full - first


@pytest.mark.real
@pytest.mark.slow
def test_context_overflow_drops_the_oldest_turn(smollm2_q4, tmp_path):
    child = _spawn("chat", smollm2_q4, *FLAGS, "-c", "256", "--system", "You are terse.")
    sent, notes = [], []
    for i in range(8):   # until the conversation outgrows the context (256 tokens)
        sent.append(f"Topic {i}: " + " ".join(f"fact {j} is about apples and pears" for j in range(4)))
        *_, printed = _turn(child, sent[-1])
        notes = [line for line in printed.splitlines() if "dropped" in line]
        if notes:
            break
    assert len(sent) > 2 and notes == ["dropped the oldest turn of the conversation to fit the context of 256 tokens"]
    child.sendline("Summarise: " + "a b c d e f " * 60)   # alone longer than the context: one error
    child.expect_exact(">>> ")
    err = ANSI.sub("", child.before)
    assert "error: this message makes a prompt of" in err and "the context holds 256" in err
    assert "dropped" not in err and "Traceback" not in err
    saved = tmp_path / "c.json"
    child.sendline(f"/save {saved}")
    child.expect_exact(">>> ")
    assert _leave(child, "/bye") == 0
    messages = json.loads(saved.read_text())
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert messages[0] == {"role": "system", "content": "You are terse."}
    # the transcript keeps the turn dropped from the context (tests/test_chat_save.py)
    assert users == sent and [m["role"] for m in messages[1:3]] == ["user", "assistant"]


@pytest.mark.real
@pytest.mark.slow
def test_ctrl_c_stops_the_answer_and_stays_in_the_chat(smollm2_q4, tmp_path):
    child = _spawn("chat", smollm2_q4, "-t", "1", "--temp", "0", "-n", "2000")
    child.sendintr()   # at the empty prompt: ollama's hint
    child.expect_exact("Use Ctrl + d or /bye to exit.")
    child.expect_exact(">>> ")
    child.sendline("Write a long story about a dragon.")
    child.expect_exact("dragon.\r\n")   # the echo, then some of the answer streams
    child.expect(r"\w+ \w+ \w+ \w+ \w+ \w+")
    child.sendintr()
    child.expect(FOOTER)
    assert "stop: interrupted" in child.after
    child.expect_exact(">>> ")
    saved = tmp_path / "c.json"
    child.sendline(f"/save {saved}")
    child.expect_exact(">>> ")
    assert _leave(child, "eof") == 0   # Ctrl-D
    messages = json.loads(saved.read_text())
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert len(messages[1]["content"].split()) >= 6   # the partial answer is kept


@pytest.mark.real
@pytest.mark.slow
def test_run_without_a_prompt_at_a_terminal_opens_the_chat(smollm2_q4):
    child = _spawn("run", smollm2_q4, *FLAGS)
    n, cached, printed = _turn(child, "Hello!")
    assert n > 0 and cached == 0 and "no prompt" not in printed
    child.kill(signal.SIGTERM)   # at the prompt: SIGTERM ends the chat (Ctrl-C would not)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 143


# ---- the command with piped input (no terminal: one message a line) -----------------------------------


@pytest.mark.real
def test_piped_chat_commands(smollm2_q4, run_cli):
    r = run_cli("chat", smollm2_q4, *FLAGS, input="/help\nHi\n/stats\n/clear\n/nope\n/save\n/save /no/such/dir/c.json\n")
    assert r.exit_code == 0, r.stderr
    assert "/save FILE" in r.stdout and "turns 1" in r.stdout and re.search(r"generated \d+ tokens", r.stdout)
    assert FOOTER.search(r.stderr)
    assert "Cleared the conversation." in r.stderr and "Unknown command '/nope'" in r.stderr
    assert "Usage: /save FILE" in r.stderr
    assert "cannot write /no/such/dir/c.json: No such file or directory" in r.stderr   # and the chat went on


@pytest.mark.real
def test_piped_chat_json_one_object_per_turn(smollm2_q4, run_cli):
    r = run_cli("chat", smollm2_q4, *FLAGS, "--json", input="Hi\nHow are you?\n")
    assert r.exit_code == 0, r.stderr
    first, second = (json.loads(line) for line in r.stdout.splitlines())
    assert first["text"] and first["n_prompt_cached"] == 0
    assert second["n_prompt"] > first["n_prompt"] and second["n_prompt_cached"] >= first["n_prompt"]


def test_chat_refuses_raw_and_models_without_a_template(tiny_models, run_cli):
    r = run_cli("chat", tiny_models["target"], "--raw", "-t", "1", input="hi\n")
    assert r.exit_code == 2 and "chat needs the model's chat template" in r.stderr
    r = run_cli("chat", tiny_models["spm"], "--spec-type", "none", "-t", "1", input="hi\n")
    assert r.exit_code == 2 and "has no chat template" in r.stderr and "Traceback" not in r.stderr
