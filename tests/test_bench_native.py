"""`bench --native`: llama.cpp's row gets exactly our prompt tokens, counts only its first -n
tokens, and a row whose greedy text differs from ours is flagged, never a speedup.

No native binary is built here: the command builder and the parser are tested on their own, and
tests/fixtures/fake_native.py stands in for `llama-speculative-simple` end to end (it reads its
prompt as llama.cpp's arg.cpp does, decodes greedily with the same llama.cpp and prints the tool's
JSON lines with a virtual clock).
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from llamaspec.bench import BenchSettings, native_command
from llamaspec.bench.native import NativeRunError, native_prompt, native_row, parse_output

FAKE = Path(__file__).parent / "fixtures" / "fake_native.py"
FAST = ("--reps", "1", "-n", "16", "-t", "1")


def _jsonl(*entries) -> str:
    return "\n".join(json.dumps({"type": "log", "time": t, "level": lv, "msg": m}) for t, lv, m in entries) + "\n"


def _log(prompt, output, n_decoded, dec_s, step_us=10_000, start_us=1_000_000):
    """What the tool prints with --log-jsonl: blank line, prompt pieces, output pieces (one stamp
    per step of `step_us`), blank line, then its summary lines."""
    entries = [(start_us - 1, "none", "\n\n")] + [(start_us - 1, "none", p) for p in prompt]
    entries += [(start_us + (i + 1) * step_us, "none", p) for i, p in enumerate(output)]
    end = start_us + int(dec_s * 1e6)
    speed = n_decoded / dec_s
    entries += [(end, "none", "\n\n"), (end, "info", "encoded    5 tokens in    0.050 seconds, speed:  100.000 t/s\n"),
                (end, "info", f"decoded {n_decoded:4d} tokens in {dec_s:8.3f} seconds, speed: {speed:8.3f} t/s\n"),
                (end, "info", "accept    = 50.000%\n"), (end, "none", "\n\n")]
    return _jsonl(*entries)


# ---- the command --------------------------------------------------------------------------------


def test_the_prompt_is_read_as_bytes_without_escapes_and_tokens_are_stamped(tmp_path):
    settings = BenchSettings(threads=1, n=32)
    cmd = native_command(tmp_path, tmp_path / "m.gguf", "ngram-simple", tmp_path / "p.txt", settings)
    # -bf keeps the file's bytes (-f would drop its trailing newline); --no-escape keeps "\n" two characters
    assert cmd[cmd.index("-bf") + 1] == str(tmp_path / "p.txt") and "-f" not in cmd and "-p" not in cmd
    assert "--no-escape" in cmd and "--log-jsonl" in cmd and "--log-timestamps" in cmd
    assert cmd[cmd.index("-n") + 1] == "32" and cmd[cmd.index("--temp") + 1] == "0"


def test_native_prompt_keeps_the_trailing_newline_and_bos_once(tiny_models):
    from llamaspec.runtime.llama import Model

    m = Model(tiny_models["target"])
    try:
        formatted = m.chat_prompt([{"role": "user", "content": 'print("a\\nb")'}])
        assert formatted.endswith("assistant\n")
        tokens = m.tokenize_prompt(formatted)
        assert native_prompt(m, formatted, tokens) == formatted   # newline and backslashes kept
        # a template that writes its BOS text: llama.cpp adds BOS itself, so it is passed without it
        bos = m.token_text(m.bos)
        assert m.add_bos and native_prompt(m, bos + formatted, m.tokenize_prompt(bos + formatted)) == formatted
        with pytest.raises(NativeRunError, match="tokenize this prompt otherwise"):
            native_prompt(m, formatted, tokens[:-1])   # no text gives these tokens: no native row
    finally:
        m.close()


# ---- the parser ---------------------------------------------------------------------------------


def test_tokens_past_n_are_not_counted():
    """-n 4, but the tool decoded 10 (its last draft ran past -n, cheaply): 4 tokens, timed to the 4th."""
    out = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
    log = parse_output(_log(["<s>", "P"], out, 10, dec_s=0.045), "Read 7 bytes from binary file p.txt\n")
    assert log.echoed == ["<s>", "P", *out] and log.n_decoded == 10 and log.prompt_bytes == 7
    r = native_row(log, "native ngram-mod", 4, ["<s>", "P"], ["a", "b", "c", "d"])
    assert (r.n, r.n_decoded, r.identical, r.first_difference) == (4, 10, True, None)
    # the 4th token's stamp is 4 steps of 10 ms after the start of decoding (its end less 45 ms)
    assert r.tps == pytest.approx(4 / 0.040, rel=1e-6) and r.e2e_s == pytest.approx(0.050 + 0.040)
    assert r.acceptance == 0.5


def test_a_run_that_stopped_at_end_of_generation_counts_what_it_printed():
    log = parse_output(_log(["P"], ["a", "b"], 3, dec_s=0.030))   # the end-of-generation token: counted, not printed
    r = native_row(log, "native x", 8, ["P"], ["a", "b"])
    assert (r.n, r.identical) == (2, True) and r.tps == pytest.approx(2 / 0.030)
    r = native_row(log, "native x", 8, ["P"], ["a", "b", "c"])   # ours went on: another text
    assert (r.identical, r.first_difference) == (False, 2)


def test_another_prompt_is_an_error_not_a_row():
    log = parse_output(_log(["<s>", "user", "\n", "assistant"], ["x"], 2, dec_s=0.02))
    with pytest.raises(NativeRunError, match="another prompt .* prompt token 4 of 5"):
        native_row(log, "native x", 1, ["<s>", "user", "\n", "assistant", "\n"], ["x"])


def test_a_plain_text_log_counts_everything_and_is_unchecked():
    from llamaspec.bench.native import parse_log

    log = parse_output("", "decoded   69 tokens in   12.135 seconds, speed:    5.686 t/s\naccept    = 100.000%\n")
    assert log.echoed is None
    r = native_row(log, "native x", 64, ["P"], ["a"])
    assert (r.n, r.n_decoded, r.identical) == (69, 69, None)
    assert parse_log("decoded   69 tokens in   12.135 seconds, speed:    5.686 t/s\n", "m").n_decoded == 69


# ---- end to end, with the stand-in ---------------------------------------------------------------


@pytest.fixture
def fake_native(tmp_path, monkeypatch):
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "llama-speculative-simple"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_NATIVE_RECORD", str(record))
    monkeypatch.setenv("FAKE_NATIVE_PAST", "0")
    monkeypatch.delenv("FAKE_NATIVE_FLIP", raising=False)
    return d, record


def _native(run_cli, tiny_models, bin_dir, *args):
    r = run_cli("bench", str(tiny_models["target"]), *FAST, "--spec-type", "ngram-simple", "--native", str(bin_dir),
                *args)
    assert r.exit_code == 0, r.stderr
    return r


def test_the_native_row_prompt_keeps_its_trailing_newline(run_cli, tiny_models, fake_native, monkeypatch):
    bin_dir, record = fake_native
    monkeypatch.setenv("FAKE_NATIVE_PAST", "20")   # it decodes 20 tokens past -n, at no cost
    prompt = 'Fix this:\nprint("a\\nb")'
    info = _native(run_cli, tiny_models, bin_dir, "-p", prompt, "--json").json()
    rec = json.loads(record.read_text())
    assert rec["prompt"].endswith("<|im_start|>assistant\n")      # as our chat prompt ends
    assert 'print("a\\nb")' in rec["prompt"]                        # no escape processing
    assert "-bf" in rec["argv"] and "--no-escape" in rec["argv"]
    modes = {m["mode"]: m for m in info["results"]}
    nat = modes["native ngram-simple"]
    # the same prompt tokens, so the same greedy text: checked, and only the first -n tokens counted
    assert nat["identical_to_plain"] is True and nat["first_difference"] is None
    assert nat["n_generated"] == modes["plain"]["n_generated"] and nat["n_decoded"] > nat["n_generated"]
    assert nat["tok_s"] == pytest.approx(100.0, rel=0.01)           # 10 ms a token; the free 20 not counted
    assert nat["ratio_vs_plain"] > 0 and nat["top2_gap"] is None
    assert any("decoded up to" in n and "the first 16 are counted" in n for n in info["notes"]), info["notes"]


def test_a_native_row_whose_text_differs_is_flagged_not_counted(run_cli, tiny_models, fake_native, monkeypatch):
    bin_dir, _ = fake_native
    monkeypatch.setenv("FAKE_NATIVE_FLIP", "5")   # the second-best token at output token 5
    r = _native(run_cli, tiny_models, bin_dir, "-p", "Tell me about the sea.", "--json")
    info = r.json()
    nat = next(m for m in info["results"] if m["mode"] == "native ngram-simple")
    assert nat["identical_to_plain"] is False and nat["first_difference"] == 5 and nat["differing_reps"] == 1
    assert nat["ratio_vs_plain"] is None and nat["e2e_ratio_vs_plain"] is None and nat["ratios"] == [None]
    assert nat["measured_ratio_other_text"] > 0 and nat["top2_gap"] >= 0
    assert info["best"]["mode"] != "native ngram-simple"
    assert info["all_identical"] is True   # about our modes; the native row says its own
    assert any("differs from ours at token 5" in n and "no ratio" in n for n in info["notes"]), info["notes"]
    assert "text differs from ours at token 5" in r.stderr and "near-tie flips" not in r.stderr
    assert info["overall"][0]["results"][-1]["ratio_vs_plain"] is None
    table = _native(run_cli, tiny_models, bin_dir, "-p", "Tell me about the sea.").stdout
    row = next(line for line in table.splitlines() if line.startswith("native ngram-simple") and "█" not in line)
    assert "other text" in row and "NO: differs from ours at token 5 (top-2 gap" in row, row


def test_reading_the_prompt_with_f_would_be_caught(run_cli, tiny_models, fake_native, monkeypatch):
    """What the bench did before: `-f FILE` drops the chat prompt's last newline. The run's echo of
    its prompt no longer matches ours: no row, a note."""
    import llamaspec.bench.native as native

    bin_dir, _ = fake_native
    real = native.native_command

    def with_f(*a, **kw):
        cmd = real(*a, **kw)
        cmd[cmd.index("-bf")] = "-f"
        return cmd

    monkeypatch.setattr(native, "native_command", with_f)
    info = _native(run_cli, tiny_models, bin_dir, "-p", "Tell me about the sea.", "--json").json()
    assert not any(m["native"] for m in info["results"])
    assert any("decoded another prompt than ours" in n for n in info["notes"]), info["notes"]


def test_a_real_jsonl_log_of_the_tool(smollm2_q4):
    """The real tool's --log-jsonl output (tests/fixtures/native/README.md): its echo of the prompt
    is our tokenization of the file, escapes untouched and the final newline kept, and of the 17
    tokens it decoded for -n 16, 16 are counted."""
    from llamaspec.bench.native import pieces
    from llamaspec.runtime.llama import Model

    logs = Path(__file__).parent / "fixtures" / "native"
    log = parse_output((logs / "ngram-simple-jsonl.stdout.log").read_text(),
                       (logs / "ngram-simple-jsonl.stderr.log").read_text())
    text = (logs / "prompt-escapes.txt").read_text()
    assert text.endswith("assistant\n") and 'print("a\\nb")' in text and log.prompt_bytes == len(text.encode())
    m = Model(smollm2_q4)   # the F16's vocabulary
    try:
        prompt = pieces(m, m.tokenize_prompt(text))
    finally:
        m.close()
    assert log.echoed[:len(prompt)] == prompt
    out = log.echoed[len(prompt):]
    assert (log.n_decoded, len(out), log.acceptance) == (17, 17, None)
    assert "".join(out).startswith('print("a\\nb")')
    r = native_row(log, "native ngram-simple", 16, prompt, out[:16])
    assert (r.n, r.n_decoded, r.identical) == (16, 17, True)
    assert r.tps == pytest.approx(16 / ((log.times_us[len(prompt) + 15] - (log.decoded_at_us - 77.308e6)) / 1e6))
