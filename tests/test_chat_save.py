"""The chat REPL's transcript and input: /save writes atomically and never overwrites a file
unless /save! says so; the transcript keeps the turns dropped from the context; bytes on a piped
stdin that are not UTF-8 are replaced and noted, never a traceback; Ctrl-C during a prompt's
evaluation drops that message from the conversation, and the chat goes on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from child_process import child_env

FLAGS = ("-t", "1", "--temp", "0", "-n", "8")
HANG_GUARD_S = 300   # a hang guard, not a speed bound


def _chat(model, stdin: bytes, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamaspec", "chat", str(model), *FLAGS, *flags], input=stdin,
                          capture_output=True, env=child_env(), timeout=HANG_GUARD_S)


@pytest.mark.real
def test_save_refuses_to_overwrite_and_bad_utf8_is_replaced(smollm2_q4, tmp_path):
    (tmp_path / "out").mkdir()
    saved = tmp_path / "out" / "c.json"
    stdin = (b"Say hi \xff\xfe please\n" + f"/save {saved}\n".encode()
             + b"Say bye\n" + f"/save {saved}\n/save! {saved}\n".encode())
    p = _chat(smollm2_q4, stdin)
    err = p.stderr.decode()
    assert p.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert "line 1 of the input is not valid UTF-8: the bad bytes were replaced by U+FFFD" in err
    assert f"{saved} exists; /save! {saved} overwrites it" in err   # the second /save
    messages = json.loads(saved.read_text(encoding="utf-8"))   # the /save! after it: both turns
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2
    assert messages[0]["content"] == "Say hi \ufffd\ufffd please" and messages[2]["content"] == "Say bye"
    assert [x.name for x in saved.parent.iterdir()] == ["c.json"]   # no temporary file left behind


@pytest.mark.real
def test_transcript_keeps_the_turns_dropped_from_the_context(smollm2_q4, tmp_path):
    saved = tmp_path / "c.json"
    sent = [f"Topic {i}: " + " ".join(f"fact {j} is about apples and pears" for j in range(4)) for i in range(6)]
    p = _chat(smollm2_q4, ("\n".join(sent) + f"\n/save {saved}\n").encode(), "-c", "256", "--system", "Be terse.")
    err = p.stderr.decode()
    assert p.returncode == 0 and "dropped the oldest turn" in err, err[-2000:]   # the context did overflow
    messages = json.loads(saved.read_text())
    assert messages[0] == {"role": "system", "content": "Be terse."}
    assert [m["content"] for m in messages if m["role"] == "user"] == sent   # every turn, dropped ones too
    assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * len(sent)


@pytest.mark.real
def test_ctrl_c_during_the_prompt_evaluation_drops_the_message(smollm2_q4, capsys):
    """A KeyboardInterrupt raised where Ctrl-C lands while a long prompt is evaluated (between two
    of its llama_decode chunks, from a decode listener): the message is not kept, the next turn
    works on the conversation as it was."""
    from llamaspec.cli._output import Output
    from llamaspec.cli.chat import ChatSession
    from llamaspec.api.generator import Generator

    with Generator(smollm2_q4, temperature=0, max_tokens=8, ctx_size=2048, threads=1) as g:
        session = ChatSession(g, Output())
        session.turn("Hello!")
        before = list(session.messages)
        armed, fired = [True], []

        def ctrl_c(ctx, tokens, start, seq_id):
            if armed and len(tokens) > 1:   # a prompt chunk, not a generation step
                armed.clear()
                fired.append(len(tokens))
                raise KeyboardInterrupt

        g.pipeline.ctx.add_decode_listener(ctrl_c)
        session.turn("Summarise this: " + "the cat sat on the mat and looked at the dog " * 60)
        assert fired and session.messages == before and session.transcript == before
        assert "interrupted before the answer began: that message is not kept" in capsys.readouterr().err
        session.turn("Say bye.")
        assert [m["role"] for m in session.messages] == ["user", "assistant"] * 2
        assert session.messages[2]["content"] == "Say bye." and session.messages[3]["content"]
