"""Every sampling and drafting setting, declared once: its name (the keyword of `Generator`, the
field of `SamplingParams`, `GenerationOptions` and `Request`), its command-line flags, its request
field (OpenAI's or llama-server's name), type, range, default and help. The CLI's options
(cli/_generation.py), `Generator`'s keyword defaults, `SamplingParams`, the request models
(openai/requests.py, batch/requests.py) and `Generator.describe()` read this table, as the
speculative types come from `speculative.options.SPEC_TYPES`.

`check(name, value)` is the one type and range check, with one wording for every way in; its
UsageError carries `field=name`. An entrance may spell the name its own way (the CLI's `--temp`):

    >>> check("top_p", 0.5), DEFAULT.temperature, DEFAULT.top_k, DEFAULT.top_p, DEFAULT.min_p
    (0.5, 0.8, 40, 0.95, 0.05)
    >>> check("temperature", -1, "--temp")
    Traceback (most recent call last):
    ...
    llamaspec.errors.UsageError: --temp must be >= 0, got -1
    >>> check("top_k", "40")
    Traceback (most recent call last):
    ...
    llamaspec.errors.UsageError: top_k must be an integer, got string

Only errors.py below it: every layer may read it (the engine's SamplingParams too).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from llamaspec.errors import INT64_MAX, INT64_MIN, SAMPLING_NUMBER, UsageError, jtype, must_be, sampling_number_ok

__all__ = ["Knob", "KNOBS", "DEFAULT", "SAMPLING", "DRAFTING", "PER_REQUEST", "MAX_DRAFT", "DRAFT_HINT", "BIAS_LIMIT",
           "check", "check_draft_min", "bias_ok", "bias_refused"]

# A verify batch is the last token + the draft, and must fit one llama.cpp batch (n_batch, 512:
# runtime's ContextConfig): only the last chunk of a longer batch has output rows.
MAX_DRAFT = 512 - 1
DRAFT_HINT = (f"a verify step evaluates the last token and the draft in one batch of {MAX_DRAFT + 1}; "
              "the adaptive length rarely goes past 32")

#: OpenAI's logit_bias range: -100..100 (-100, or -inf, bans a token)
BIAS_LIMIT = 100

_SAME = object()   # cli_default: the command line's default is the table's


@dataclass(frozen=True)
class Knob:
    """One setting. `low`/`high` bound it (None: no bound; `open_low`: `> low`); `note` says what
    its special values mean (the hint of a range error); `wire` is its request field (None: not
    set per request); `optional`: None is a value (decided later: the resolved draft length, a
    random seed, no token limit); `flag`: how messages spell the flag (default: the first)."""

    name: str
    flags: tuple[str, ...]
    kind: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    note: str = ""
    wire: str | None = None
    optional: bool = False
    flag: str = ""
    cli_default: Any = _SAME   # the command line's default where it differs (run's -n 256)

    @property
    def spelled(self) -> str:
        """The flag as messages name it."""
        return self.flag or self.flags[0]

    @property
    def cli(self) -> Any:
        """The command line's default."""
        return self.default if self.cli_default is _SAME else self.cli_default


KNOBS: dict[str, Knob] = {k.name: k for k in (
    # -- target sampling (SamplingParams; llama.cpp's defaults, common_params_sampling)
    Knob("temperature", ("--temp",), float, 0.8, "Temperature; 0 = greedy.", low=0, note="0 means greedy",
         wire="temperature"),
    Knob("top_k", ("--top-k",), int, 40, "Sample among the k most likely tokens; <= 0: off.", wire="top_k"),
    Knob("top_p", ("--top-p",), float, 0.95, "Sample among the most likely tokens that make up this "
         "probability; 1: off.", low=0, high=1, open_low=True, wire="top_p"),
    Knob("min_p", ("--min-p",), float, 0.05, "Drop tokens less likely than this times the most likely one; 0: off.",
         low=0, high=1, wire="min_p"),
    Knob("repeat_penalty", ("--repeat-penalty",), float, 1.0, "Penalizes the tokens in the last --repeat-last-n "
         "(a positive logit divided by it, a negative one multiplied); 1 = off.", low=0, open_low=True, note="1 is off", wire="repeat_penalty"),
    Knob("repeat_last_n", ("--repeat-last-n",), int, 64, "Tokens the penalties look back over; -1: all, 0: off.",
         low=-1, note="-1: every token, 0: off"),
    # the penalties: OpenAI's range; llama.cpp takes any value, but outside it a token's logit moves
    # by more than any sane request means
    Knob("presence_penalty", ("--presence-penalty",), float, 0.0, "Subtracted from the logit of every token "
         "already in the last --repeat-last-n; 0 = off.", low=-2, high=2, wire="presence_penalty"),
    Knob("frequency_penalty", ("--frequency-penalty",), float, 0.0, "Subtracted from a token's logit once per "
         "time it is in the last --repeat-last-n; 0 = off.", low=-2, high=2, wire="frequency_penalty"),
    Knob("seed", ("-s", "--seed"), int, None, "Sampling seed (same seed, same output); default or -1: random.",
         note="-1: a random seed", wire="seed", optional=True, flag="--seed"),
    # -- output
    Knob("max_tokens", ("-n", "--n-predict"), int, None, "Tokens to generate; -1: until end-of-generation "
         "or a full context.", low=-1, note="-1: no limit", wire="max_tokens", optional=True, cli_default=256),
    # -- drafting (GenerationOptions, SpecOptions; llama.cpp's --spec-draft-* flags)
    Knob("draft_max", ("--draft-max", "--spec-draft-n-max"), int, None, "Most draft tokens per step (adaptive "
         "below it).", low=0, high=MAX_DRAFT, note=DRAFT_HINT, optional=True),
    Knob("draft_min", ("--draft-min", "--spec-draft-n-min"), int, 0, "Drop drafts shorter than this.",
         low=0, high=MAX_DRAFT, note=DRAFT_HINT),
    Knob("draft_p_min", ("--draft-p-min", "--spec-draft-p-min"), float, 0.0, "Draft model stops when its top "
         "probability is below this.", low=0, high=1),
)}

#: SamplingParams' fields, in the table's order
SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
            "frequency_penalty", "seed")
DRAFTING = ("draft_max", "draft_min", "draft_p_min")
#: the sampling settings a request may set (Request's and the request bodies' fields)
PER_REQUEST = tuple(n for n in SAMPLING if KNOBS[n].wire)

#: the defaults by name: `DEFAULT.temperature` (the Generator's keywords, SamplingParams' fields)
DEFAULT = SimpleNamespace(**{k.name: k.default for k in KNOBS.values()})


def _shown(v: Any) -> str:
    """A value as a message shows it (an integer too long to print, by its size)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
        return f"an integer of {v.bit_length()} bits"
    return str(v)


def check(name: str, value: Any, spell: str | None = None, *, low: float | None = None) -> Any:
    """`value` if it is a valid `name` (an int as an int: numpy integers become int), else a
    UsageError carrying field=name, worded one way: `<spell> must be an integer|a number, got
    <JSON type>`, `... must be a 64-bit integer ...`, `... must be a finite number ...` (a sampling
    number: float32's range, errors.sampling_number_ok) or `... must be <range>, got <value>`.
    spell: how the entrance names it (the CLI's flag; default: the name). low: an entrance's own
    lower bound, tighter than the table's (bench's --draft-max 1, a batch line's max_tokens 1)."""
    k = KNOBS[name]
    said = spell or name
    if value is None and k.optional:
        return None

    def refuse(message: str, hint: str | None = None) -> UsageError:
        return UsageError(message, hint, field=name)

    if k.kind is int:
        if isinstance(value, bool) or not hasattr(value, "__index__"):   # int, numpy integers
            raise refuse(f"{said} must be an integer, got {jtype(value)}", k.note or None)
        value = operator.index(value)
        if not INT64_MIN <= value <= INT64_MAX:
            raise refuse(f"{said} must be a 64-bit integer (between -2^63 and 2^63-1), got {_shown(value)}",
                         k.note or None)
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise refuse(f"{said} must be a number, got {jtype(value)}", k.note or None)
        if not sampling_number_ok(value):   # inf, NaN, 1e-310, 1e300: logits would turn inf or NaN
            raise refuse(f"{said} must be {SAMPLING_NUMBER}, got {_shown(value)}")
    lo = k.low if low is None else low
    too_low = lo is not None and (value <= lo if k.open_low and low is None else value < lo)
    if too_low or (k.high is not None and value > k.high):
        own = too_low and low is not None   # (the entrance's bound: the table's note may not hold there)
        raise refuse(must_be(said, lo, k.high, open_low=k.open_low and low is None, got=_shown(value)),
                     None if own else k.note or None)
    return value


def check_draft_min(draft_min: int, draft_max: int | None, *, flags: bool = False,
                    resolved: str | None = None) -> None:
    """The one rule between the two draft lengths: draft_min <= draft_max, named by the fields or,
    with `flags`, the CLI's flags. resolved: draft_max is the length the spec types resolved to
    (the pipeline's check), this text after it (" (ngram-mod's default)", or "")."""
    if draft_max is None or draft_min <= draft_max:
        return
    lo, hi = (KNOBS["draft_min"].spelled, KNOBS["draft_max"].spelled) if flags else ("draft_min", "draft_max")
    if resolved is not None:
        raise UsageError(f"{lo} {draft_min} exceeds the draft length {draft_max}{resolved}",
                         f"lower {lo}, or raise {hi}", field="draft_min")
    raise UsageError(f"{lo} {draft_min} exceeds {hi} {draft_max}", f"{lo} must be between 0 and {hi}",
                     field="draft_min")


def bias_ok(bias: Any) -> bool:
    """A logit_bias value: a number from -BIAS_LIMIT to BIAS_LIMIT, or -inf (bans the token)."""
    return not isinstance(bias, bool) and isinstance(bias, (int, float)) and (
        -BIAS_LIMIT <= bias <= BIAS_LIMIT or bias == -math.inf)


def bias_refused(name: str, key: Any, shown: str) -> str:
    """The one message for a bias out of range (`shown`: the value as the entrance shows it)."""
    return f"{name}[{key}] must be a number from -{BIAS_LIMIT} to {BIAS_LIMIT}, got {shown}"
