"""The Python API under misuse: Ctrl-C stops a script's loop (GenerationInterrupted carries the
partial Result), and bad inputs are UsageErrors that name the field, as the CLI's flags are."""

from __future__ import annotations

import signal
import textwrap

import pytest

from child_process import Child
from llamaspec.errors import UsageError
from llamaspec.api.generator import Generator, Request

# A user's script: three generate calls in a loop, each long; it prints a line as each call starts,
# and once the first call is generating (a decode listener's line after the prompt's decode).
_LOOP = textwrap.dedent("""
    import sys
    from llamaspec import Generator, GenerationInterrupted
    with Generator(sys.argv[1], spec_type="none", temperature=0, max_tokens=100000, ctx_size=4096,
                   chat=False, threads=1) as g:
        decodes = []

        def on_decode(*_):
            decodes.append(1)
            if len(decodes) == 3:
                print("generating", flush=True)

        g.pipeline.ctx.add_decode_listener(on_decode)
        try:
            for i in range(3):
                print("call", i, flush=True)
                g.generate("Once upon a time")
                print("returned", i, flush=True)
        except GenerationInterrupted as e:
            print("interrupted", e.result.finish_reason, len(e.result.tokens) > 0, flush=True)
            raise
""")


def test_sigint_in_a_generate_loop_stops_the_script_mid_call(tiny_models, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(_LOOP)
    c = Child(argv=[str(script), str(tiny_models["target"])])
    # the call runs until its 4096-token context is full: far longer than the signal takes
    c.wait_for(lambda: "generating" in c.stdout, "the first call generating")
    code = c.stop(signal.SIGINT)
    out, err = c.stdout, c.stderr
    assert out.startswith("call 0\ngenerating\n"), out
    assert "interrupted interrupted True" in out, (out, err[-2000:])
    assert "call 1" not in out and "returned" not in out   # the loop did not go on
    assert code != 0 and "GenerationInterrupted" in err   # uncaught, it ends the script


@pytest.fixture(scope="module")
def gen(tiny_models):
    with Generator(tiny_models["target"], spec_type="none", temperature=0, max_tokens=4, threads=1) as g:
        yield g


@pytest.mark.parametrize("field, value", [("temperature", -1), ("top_p", 5), ("max_tokens", -3), ("top_k", "a"),
                                          ("min_p", 2.0), ("repeat_penalty", 0.0), ("stop", [3])])
def test_request_values_the_cli_refuses_are_refused_naming_the_field(gen, field, value):
    with pytest.raises(UsageError, match=field):
        gen.generate(Request("hi", **{field: value}))


@pytest.mark.parametrize("prompt, match", [(42, "prompt must be text or a list of chat messages, not int"),
                                           ([], "messages must be a non-empty array"),
                                           ([{"content": "hi"}], r"messages\[0\]\.role"),
                                           ([{"role": "user", "content": 5}], r"messages\[0\]\.content"),
                                           ([{"role": "user", "content": [{"type": "image_url"}]}],
                                            "only text content parts")])
def test_bad_prompts_are_usage_errors(gen, prompt, match):
    with pytest.raises(UsageError, match=match):
        gen.generate(prompt)


def test_openai_content_parts_work_in_generate(tiny_models):
    with Generator(tiny_models["target"], spec_type="none", temperature=0, max_tokens=6, threads=1) as g:
        if g.pipeline.target.chat_template is None:
            pytest.skip("the tiny target has no chat template")
        parts = g.generate([{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}])
        plain = g.generate([{"role": "user", "content": "Hel\nlo"}])   # text parts joined by newlines
    assert parts.tokens == plain.tokens and parts.n_prompt == plain.n_prompt


def test_content_parts_on_the_real_model(smollm2_q4):
    with Generator(smollm2_q4, spec_type="none", temperature=0, max_tokens=6, threads=1) as g:
        parts = g.generate([{"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]}])
        plain = g.generate([{"role": "user", "content": "Name a \ncolour."}])
    assert parts.tokens == plain.tokens and parts.text == plain.text


def test_generate_after_close_is_a_usage_error(tiny_models):
    g = Generator(tiny_models["target"], spec_type="none", temperature=0, max_tokens=2, threads=1)
    g.close()
    with pytest.raises(UsageError, match="closed"):
        g.generate("hi")
    with pytest.raises(UsageError, match="closed"):
        list(g.generate_many(["hi"]))


def test_generate_stream_yields_the_same_text_and_result(tiny_models):
    with Generator(tiny_models["target"], draft=tiny_models["draft"], temperature=0, max_tokens=24, threads=1,
                   chat=False) as g:
        whole = g.generate("The quick brown fox")
        stream = g.generate("The quick brown fox", stream=True)
        pieces = list(stream)
        assert len(pieces) > 1 and "".join(pieces) == whole.text
        assert stream.result.tokens == whole.tokens and stream.result.finish_reason == whole.finish_reason
        # breaking out early ends the generation cleanly; the next call is unaffected
        early = g.generate("The quick brown fox", stream=True)
        for _ in early:
            break
        assert early.result.finish_reason == "interrupted"
        assert g.generate("The quick brown fox").tokens == whole.tokens
