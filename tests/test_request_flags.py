"""run's --ignore-eos and -l/--logit-bias (llama.cpp's flags): the Generator's default of every
request that sets none, checked by the one parser (openai/requests.py) with a request's words."""

from __future__ import annotations

import doctest
import json

import pytest

from llamaspec.cli import _options
from llamaspec.errors import UsageError

GREEDY = ("--temp", "0", "-t", "1", "--spec-type", "none", "--json")


def _run(run_cli, model, *args):
    r = run_cli("run", model, "-p", "Say hi.", *GREEDY, *args)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_logit_bias_flags_read_llama_cpps_form():
    assert doctest.testmod(_options, extraglobs={}).failed == 0
    assert _options.logit_bias_flags(None) is None
    with pytest.raises(UsageError, match=r"^logit_bias\[15\] must be a number from -100 to 100, got 500$"):
        _options.logit_bias_flags(["15+500"])
    for bad in ("abc", "15", "+1", "15*2", "x+1"):
        with pytest.raises(UsageError, match="takes TOKEN_ID"):
            _options.logit_bias_flags([bad])


@pytest.mark.real
def test_ignore_eos_and_logit_bias_reach_the_output(run_cli, smollm2_f16):
    plain = _run(run_cli, smollm2_f16, "-n", "48")
    assert plain["stop_reason"] == "eos" and len(plain["tokens"]) < 48   # (else the test means nothing)
    past = _run(run_cli, smollm2_f16, "-n", "48", "--ignore-eos")
    assert past["stop_reason"] == "length" and len(past["tokens"]) == 48
    assert past["tokens"][:len(plain["tokens"])] == plain["tokens"]
    first = plain["tokens"][0]
    banned = _run(run_cli, smollm2_f16, "-n", "8", "-l", f"{first}-inf")
    assert banned["tokens"][0] != first
    r = run_cli("run", smollm2_f16, "-p", "hi", "-n", "2", "-l", "99999+1")
    assert r.exit_code != 0 and "logit_bias: 99999 is not a token id of this model" in r.stderr
