"""Request fields that would change the output and that llamaspec does not implement (OpenAI's,
vLLM's batch extras, llama-server's sampling fields), each with the values that ask for nothing.
Clients send them at neutral values ("mirostat": 0, "typical_p": 1); dropping any other value
silently would hand back something else than what was asked for, so it is refused naming the field.

    >>> unsupported_field({"mirostat": 0, "typical_p": 1, "user": "me"}) is None
    True
    >>> unsupported_field({"mirostat": 2})[0]
    'mirostat'
"""

from __future__ import annotations

from typing import Any, Callable

from llamaspec.errors import sampling_number_ok

def _off(v: Any) -> bool:
    return v is None or v is False


def _at(neutral: Any) -> Callable[[Any], bool]:
    return lambda v: v is None or (not isinstance(v, bool) and v == neutral)


def _any_number(v: Any) -> bool:
    return v is None or (not isinstance(v, bool) and isinstance(v, (int, float)) and sampling_number_ok(v))


def _at_most(limit: float) -> Callable[[Any], bool]:
    return lambda v: v is None or (_any_number(v) and v <= limit)


def _at_least(limit: float) -> Callable[[Any], bool]:
    return lambda v: v is None or (_any_number(v) and v >= limit)


# llamaspec's sampler chain, in its order (verify.target_candidates); llama-server's `samplers`
# (names, or one letter each) asks for nothing new when these come in this order and the others
# it names are the stages that its neutral values switch off (dry, typ_p, top_n_sigma, xtc, ...).
_OUR_SAMPLERS = ("penalties", "top_k", "top_p", "min_p", "temperature")
_SAMPLER_LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
                    "m": "min_p", "x": "xtc", "t": "temperature", "a": "adaptive_p"}
_OTHER_SAMPLERS = {"dry", "top_n_sigma", "typ_p", "typical_p", "xtc", "adaptive_p", "infill"}


def _samplers_neutral(v: Any) -> bool:
    if v is None:
        return True
    names = [_SAMPLER_LETTERS.get(c, c) for c in v] if isinstance(v, str) else v
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return False
    if any(n not in _OUR_SAMPLERS and n not in _OTHER_SAMPLERS for n in names):
        return False
    # (a chain without penalties is common, e.g. SillyTavern's: the same while they are off, 1.0)
    ours = [n for n in names if n in _OUR_SAMPLERS]
    return ours in (list(_OUR_SAMPLERS), list(_OUR_SAMPLERS[1:]))


# Fields that would change the output and that llamaspec does not implement, with the values that
# ask for nothing. Dropping them silently would hand back something else than what was asked for.
UNSUPPORTED = {
    "n": lambda v: v is None or v == 1, "best_of": lambda v: v is None or v == 1, "echo": _off,
    "suffix": lambda v: v is None or v == "",
    # (OpenAI's deprecated names of tools / tool_choice)
    "functions": lambda v: v is None or v == [], "function_call": lambda v: v is None or v == "none",
    "audio": _off, "modalities": lambda v: v is None or v == ["text"], "prediction": _off,
    # vLLM's extras, seen in batch files written for vLLM's run-batch
    "use_beam_search": _off,
}

# Refused with their own reason: what to send instead.
REASONS = {
    "guided_regex": "a bare regular expression is not a constraint here; give it as a GBNF grammar (guided_grammar)",
    "functions": "send tools (the same functions, as [{\"type\": \"function\", \"function\": ...}])",
    "function_call": "send tool_choice",
}
UNSUPPORTED["guided_regex"] = _off

# llama-server's own sampling fields (tools/server/server-schema.cpp): clients written for it send
# them at their neutral values ("mirostat": 0, "typical_p": 1), which ask for nothing; any other
# value is refused naming the field. The `any number` ones only matter when their switch is on.
LLAMA_SERVER_UNSUPPORTED = {
    "mirostat": _at(0), "mirostat_tau": _any_number, "mirostat_eta": _any_number,
    "typical_p": _at_least(1), "top_n_sigma": _at_most(0), "n_probs": _at(0), "post_sampling_probs": _off,
    "min_keep": _at(0), "dynatemp_range": _at(0), "dynatemp_exponent": _any_number,
    "dry_multiplier": _at(0), "dry_base": _any_number, "dry_allowed_length": _any_number,
    "dry_penalty_last_n": _any_number, "dry_sequence_breakers": lambda v: v is None or isinstance(v, list),
    "xtc_probability": _at(0), "xtc_threshold": _any_number,
    "adaptive_target": _at_most(0), "adaptive_decay": _any_number,
    "samplers": _samplers_neutral, "lora": lambda v: not v, "n_cmpl": _at(1),
    "t_max_predict_ms": _at_most(0), "continue_final_message": _off, "n_indent": _at(0),
}




def unsupported_field(body: dict) -> tuple[str, str] | None:
    """The first field of `body` asking for something llamaspec does not do, with why; else None."""
    for key, harmless in UNSUPPORTED.items():
        if key in body and not harmless(body[key]):
            return key, REASONS.get(key, "llamaspec gives one plain-text choice per request")
    for key, harmless in LLAMA_SERVER_UNSUPPORTED.items():
        if key in body and not harmless(body[key]):
            return key, ("llamaspec samples with penalties, top_k, top_p, min_p and temperature only; "
                         "leave it out or send llama-server's neutral value")
    return None
