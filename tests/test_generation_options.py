"""GenerationOptions and SamplingParams: the one typed path from flags (or a script) to Generator,
validated once, with errors that name the field."""

from __future__ import annotations

import pytest

from llamaspec.errors import UsageError
from llamaspec.api.options import GenerationOptions, check_stop
from llamaspec.speculative.sampling_params import SamplingParams


@pytest.mark.parametrize("field, value", [("temperature", -1), ("top_p", 5), ("top_p", 0), ("min_p", -0.1),
                                          ("repeat_penalty", 0), ("repeat_last_n", -2), ("temperature", "hot"),
                                          ("temperature", float("nan")), ("top_k", 1.5), ("seed", "x")])
def test_sampling_params_refuse_bad_values_naming_the_field(field, value):
    with pytest.raises(UsageError, match=field):
        SamplingParams(**{field: value})


def test_sampling_params_accept_llama_cpp_defaults_and_greedy():
    assert SamplingParams().temperature == 0.8
    assert SamplingParams(temperature=0, top_k=0, top_p=1, min_p=0, repeat_last_n=-1).greedy


@pytest.mark.parametrize("kwargs, field", [({"max_tokens": -3}, "max_tokens"), ({"parallel": 0}, "parallel"),
                                           ({"draft_min": 5, "draft_max": 2}, "draft_min"),
                                           ({"stop": [1]}, "stop"), ({"stop": 7}, "stop")])
def test_generation_options_refuse_bad_values(kwargs, field):
    with pytest.raises(UsageError, match=field):
        GenerationOptions(**kwargs)


def test_stop_takes_a_string_or_a_list():
    assert check_stop("END") == ("END",)
    assert check_stop(["a", "b"]) == ("a", "b")
    assert check_stop(None) == ()


def test_run_builds_generator_from_one_options_object(run_cli, tiny_models, generator_options):
    """`run` hands Generator.from_options one GenerationOptions carrying its flags."""
    seen = generator_options
    r = run_cli("run", tiny_models["target"], "--raw", "-p", "hi", "-n", "3", "--temp", "0", "--top-k", "7",
                "--stop", "zz", "--spec-type", "none", "-t", "1", "--json")
    assert r.exit_code == 0, r.stderr
    (opts,) = seen
    assert isinstance(opts, GenerationOptions)
    assert opts.sampling.greedy and opts.sampling.top_k == 7 and opts.stop == ("zz",)
    assert opts.max_tokens == 3 and opts.spec_type == "none" and opts.chat is False and opts.threads == 1
