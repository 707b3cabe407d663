"""What goes into one generation and what comes out: `Request` and `Result` (the Python API's
types; `llamaspec.api.generator` exports them, and serve, batch and the OpenAI layer build on them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from llamaspec.errors import LlamaspecError
from llamaspec.knobs import PER_REQUEST

if TYPE_CHECKING:
    from llamaspec.runtime.grammar import GrammarSpec
    from llamaspec.speculative.logprobs import TokenLogprob

# A prompt: text (the chat template is applied when the model has one, unless chat=False) or a
# list of chat messages [{"role": ..., "content": ...}].
Prompt = str | Sequence[dict]


@dataclass
class Result:
    """One generation: text, tokens, why it stopped, and the numbers `run --json` prints.

    logprobs: one TokenLogprob per output token when the request asked for them (else None).
    tool_calls: the calls parsed from the reply (OpenAI's form: id, type "function", function
    {name, arguments as a JSON string}) when the request offered tools, else None; content: the
    text outside them (None when the reply is only calls). finish_reason is "tool_calls" then.
    """

    id: str
    text: str
    tokens: list[int]
    finish_reason: str          # "stop" (EOS or a stop string), "length", "context", "interrupted", "tool_calls"
    stop_reason: str            # the engine's finer reason: "eos" | "stop" | "length" | ...
    n_prompt: int
    stats: dict[str, Any] = field(default_factory=dict)
    error: LlamaspecError | None = None   # generate_many: this prompt could not run (the rest did)
    logprobs: "list[TokenLogprob] | None" = None
    tool_calls: list[dict] | None = None
    content: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"id": self.id, "text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
             "stop_reason": self.stop_reason, "n_prompt": self.n_prompt, **self.stats}
        if self.error is not None:
            d["error"] = self.error.message
        if self.tool_calls is not None:
            d["tool_calls"], d["content"] = self.tool_calls, self.content
        if self.logprobs is not None:
            d["logprobs"] = [{"token": lp.token, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}
                             for lp in self.logprobs]
        return d


@dataclass
class Request:
    """A prompt with optional per-request settings (None: the Generator's).

    Structured output (llamaspec/api/constraints.py checks them): grammar, GBNF text (or a built
    GrammarSpec, whose `field` then names it in errors); json_schema, a JSON schema (dict, its
    JSON text, or True/{} for any JSON value); not both. logit_bias: token id -> bias added to the
    target's logits (-100..100, OpenAI's range; -100 bans a token). logprobs: N (0-20) gives each
    output token's logprob and its N most likely alternatives. tools / tool_choice /
    parallel_tool_calls: OpenAI's (chat prompts; the reply's calls land in Result.tool_calls).
    """

    prompt: Prompt
    id: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: Sequence[str] | None = None
    chat: bool | None = None   # a text prompt: apply the chat template (None: the Generator's choice)
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool = False   # never end at an end-of-generation token (llama-server's ignore_eos)
    grammar: "str | GrammarSpec | None" = None
    json_schema: dict | str | bool | None = None
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None

    SAMPLING = PER_REQUEST   # the SamplingParams fields a request may set (the knob table's)


REQUEST_FIELDS = frozenset(f for f in Request.__dataclass_fields__ if f != "prompt")


def finish_reason(stop_reason: str) -> str:
    """OpenAI's finish_reason for an engine stop reason ("eos" and stop strings are both "stop")."""
    return {"eos": "stop", "stop": "stop"}.get(stop_reason, stop_reason)
