"""Chat templates come from model files: they are rendered sandboxed (runtime/chat_template.py).

Tiny GGUFs whose `tokenizer.chat_template` tries to reach Python internals, loops forever, builds a
huge string, has a syntax error or calls raise_exception are run through `run` (real llama.cpp):
one line naming the model file, exit code 1, no traceback; `--raw` still works on the same file.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import pytest

from llamaspec.errors import ChatTemplateError
from llamaspec.runtime.chat_template import render
from llamaspec.testing.tiny_models import BASE_SEED, bpe_vocab, write_llama_model

HANG_GUARD_S = 60   # a hang guard, not a speed bound: speed belongs to benchmarks

CASES: Counter = Counter()

UNSAFE = "its chat template tried an unsafe operation"
HOSTILE = {  # name -> (template, what the error says)
    "mro-subclasses": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", UNSAFE),
    "class-alone": ("{{ ''.__class__ }}", UNSAFE),  # the stock sandbox renders this as '' silently
    "cycler-globals": ("{{ cycler.__init__.__globals__ }}", UNSAFE),
    "cycler-os": ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", UNSAFE),
    "joiner-globals": ("{{ joiner.__init__.__globals__['__builtins__'] }}", UNSAFE),
    "namespace-init": ("{{ namespace.__init__ }}", UNSAFE),
    "self-init": ("{{ self.__init__.__globals__ }}", UNSAFE),
    "messages-getitem": ("{{ messages.__getitem__ }}", UNSAFE),
    "attr-filter": ("{{ messages|attr('__class__') }}", UNSAFE),
    "format-attr": ("{{ '{0.__class__.__init__.__globals__}'.format(messages) }}", UNSAFE),
    "format-map": ("{{ '{m.__class__}'.format_map({'m': messages}) }}", UNSAFE),
    "format-width": ("{{ '{:>999999999}'.format('x') }}", UNSAFE),
    "percent-width": ("{{ '%999999999s' % 'x' }}", UNSAFE),
    "repeat-bomb": ("{{ 'a' * 10**10 }}", UNSAFE),
    "list-bomb": ("{{ ([0] * 100000000)|length }}", UNSAFE),
    "center-bomb": ("{{ 'x'|center(10**9) }}", UNSAFE),
    "power-bomb": ("{{ 9**99999 }}", UNSAFE),
    "concat-doubling": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s|length }}", UNSAFE),
    "replace-doubling": ("{% set ns = namespace(s='xx') %}{% for i in range(64) %}"
                         "{% set ns.s = ns.s|replace('x', 'xx') %}{% endfor %}", UNSAFE),
    "lipsum-bomb": ("{{ lipsum(10**7) }}", UNSAFE),
    "endless-loop": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "did not finish within"),
    "recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "failed: RecursionError"),
    "syntax-error": ("{% for m in messages %}{{ m.content }", "has a syntax error at line 1"),
    "unclosed-block": ("{% if true %}\n{% for m in messages %}\n", "has a syntax error at line"),
    "raise-exception": ("{{ raise_exception('Conversation roles must alternate user/assistant') }}",
                        "refused the messages: Conversation roles must alternate user/assistant"),
    "undefined-call": ("{{ nope() }}", "its chat template failed"),
    "zero-division": ("{{ 1 // 0 }}", "its chat template failed: ZeroDivisionError"),
}
GOOD = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _render(template: str, **kw) -> str:
    return render(template, [{"role": "user", "content": "hi"}], source="m.gguf", time_limit=2, **kw)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_one_clean_error(name):
    template, says = HOSTILE[name]
    start = time.monotonic()
    with pytest.raises(ChatTemplateError) as info:
        _render(template)
    assert time.monotonic() - start < HANG_GUARD_S   # the render's own time limit ended it
    msg = info.value.message
    assert msg.startswith("m.gguf: its chat template") and says in msg and "\n" not in msg, msg
    assert "--raw" in info.value.hint and info.value.exit_code == 1


def test_ordinary_templates_render_as_before():
    assert _render(GOOD) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    out = _render("{{ bos_token }}{{ messages|tojson }}{% if tools is none %}|no tools{% endif %}"
                  "{% generation %}{{ eos_token }}{% endgeneration %}{{ strftime_now('%Y')|length }}"
                  "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{% endfor %}",
                  bos_token="<s>", eos_token="</s>")
    assert out == '<s>[{"role": "user", "content": "hi"}]|no tools</s>4'
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # what chat_prompt used before

    ref = Jinja2ChatFormatter(template=GOOD, eos_token="", bos_token="", add_generation_prompt=True)
    assert _render(GOOD) == ref(messages=[{"role": "user", "content": "hi"}]).prompt
    big = "word " * 1_000_000  # a long prompt is not a "huge value"
    assert len(render(GOOD, [{"role": "user", "content": big}], source="m.gguf")) > len(big)


# ---- through the CLI, on real GGUFs ---------------------------------------------------------------

CLI_CASES = ["mro-subclasses", "cycler-globals", "format-attr", "repeat-bomb", "concat-doubling", "syntax-error",
             "raise-exception", "recursion"]


@pytest.fixture(scope="module")
def template_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("templates")
    out = {}
    for name in CLI_CASES + ["good"]:
        template = GOOD if name == "good" else HOSTILE[name][0]
        out[name] = write_llama_model(d / f"tmpl-{name}.gguf", n_layer=1, seed=BASE_SEED, name=f"tmpl-{name}",
                                      vocab=dataclasses.replace(bpe_vocab(), chat_template=template))
    return out


@pytest.mark.parametrize("name", CLI_CASES)
def test_run_on_a_model_with_a_hostile_template(run_cli, template_models, name):
    path = template_models[name]
    for extra in (["--spec-type", "none"], []):  # plain decoding, and the default (prompt-lookup)
        r = run_cli("run", path, "-p", "hello", "-n", "4", *extra)
        assert r.exit_code == 1, (r.exit_code, r.stderr)
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert "Traceback" not in r.stderr and len(errors) == 1, r.stderr
        assert f"{path}: its chat template" in r.stderr and HOSTILE[name][1] in r.stderr and "--raw" in r.stderr
        CASES["run"] += 1
    r = run_cli("run", path, "-p", "hello", "-n", "4", "--raw", "--spec-type", "none")
    assert r.exit_code == 0, r.stderr  # the file itself is fine: --raw skips the template
    CASES["run"] += 1


def test_good_template_model_runs(run_cli, template_models):
    r = run_cli("run", template_models["good"], "-p", "hello", "-n", "4", "--spec-type", "none")
    assert r.exit_code == 0, r.stderr
