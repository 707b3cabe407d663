"""A request's structured-output fields, checked, as the engine takes them: its grammar (GBNF,
a JSON schema, or the tool plan's), logit bias and logprobs; and the reply's tool calls.

Errors name the field (`json_schema: 'minimum' ... is not supported`), before any generation:
a grammar is compiled once against the target here, so a bad one never reaches the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llamaspec.errors import UsageError

if TYPE_CHECKING:
    from llamaspec.openai.tools import ToolPlan
    from llamaspec.api.request import Request
    from llamaspec.runtime.grammar import GrammarSpec


def grammar_of(grammar: Any, json_schema: Any, *, grammar_field: str = "grammar",
               schema_field: str = "json_schema") -> "GrammarSpec | None":
    """The GrammarSpec of a GBNF text (or a GrammarSpec as is) or a JSON schema; None when neither.
    Both given is a UsageError; a schema the grammar engine cannot enforce a GrammarError naming its field."""
    from llamaspec.openai.response_format import gbnf_spec, one_constraint
    from llamaspec.runtime.grammar import GrammarSpec, grammar_from_schema

    one_constraint([n for n, v in ((grammar_field, grammar), (schema_field, json_schema)) if v is not None])
    if isinstance(grammar, GrammarSpec):
        return grammar
    if grammar is not None:
        return gbnf_spec(grammar, grammar_field)
    if json_schema is None:
        return None
    return grammar_from_schema(json_schema, field=schema_field)


GBNF_HINT = "check the GBNF syntax (llama.cpp's grammars/README.md), e.g. root ::= \"yes\" | \"no\""


def check_compiles(target, spec: "GrammarSpec") -> None:
    """Compile `spec` once against the target's vocabulary: a GrammarError naming its field (and
    what to do) when llama.cpp refuses it."""
    from llamaspec.runtime.grammar import GrammarError, check_grammar

    try:
        check_grammar(target, spec)
    except GrammarError as e:
        e.hint = e.hint or GBNF_HINT
        raise


def check_logit_bias(bias: dict[int, float] | None, n_vocab: int, name: str = "logit_bias") -> dict[int, float] | None:
    """A parsed logit_bias (openai/requests.py checked its ids and biases: one check for every way
    in) with every id in this model's vocabulary."""
    for tok in bias or ():
        if not 0 <= tok < n_vocab:
            raise UsageError(f"{name}: {tok} is not a token id of this model (0 to {n_vocab - 1})",
                             "tokenize the text to find its ids", field=name)
    return bias or None


@dataclass(frozen=True)
class Constraints:
    """What a request's structured fields became: the engine's settings and its tool plan.

    plan: the tool plan that renders the prompt (tools given, even with tool_choice "none");
    calls: whether the reply is parsed for tool calls (tools offered and tool_choice not "none").
    """

    grammar: "GrammarSpec | None" = None
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    plan: "ToolPlan | None" = None
    calls: bool = False

    def config_fields(self) -> dict[str, Any]:
        """GenerationConfig's keyword arguments for what is set (speculative/sequence.py)."""
        fields = {"grammar": self.grammar, "logit_bias": self.logit_bias, "logprobs": self.logprobs}
        return {k: v for k, v in fields.items() if v is not None}


def constraints(req: "Request", target, default: "GrammarSpec | None", template: str | None) -> Constraints:
    """A checked request's (api/preparation.py `checked`: its grammar one GrammarSpec) grammar,
    logit_bias and tools against the target (a runtime Model): the grammar compiled, the bias ids
    in the vocabulary, the tools planned; `default` is the Generator's grammar (--grammar, -j),
    used when the request sets none and offers no tools to call; `template` renders the tools."""
    own = req.grammar
    plan = None
    if req.tools is not None or req.tool_choice is not None or req.parallel_tool_calls is not None:
        from llamaspec.openai.tools import plan_tools

        plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, template)
    calls = plan is not None and plan.choice != "none"
    if calls and own is not None:
        raise UsageError(f"{own.field} cannot constrain a reply that may call tools",
                         'drop it, or set tool_choice "none" (the tools constrain their calls themselves)',
                         field=own.field)
    spec = own if own is not None else plan.grammar if calls else default
    if spec is not None and spec is not default:   # (the default was compiled when the Generator loaded)
        check_compiles(target, spec)
    return Constraints(spec, check_logit_bias(req.logit_bias, target.n_vocab), req.logprobs,
                       plan, calls)


def tool_reply(plan: "ToolPlan", text: str, finish: str) -> tuple[str | None, list[dict], str]:
    """(content, tool_calls, finish_reason) of a reply to a request that offered tools: OpenAI's
    finish_reason is "tool_calls" when the reply made calls and ended by itself."""
    content, calls = plan.parse(text)
    return content, calls, "tool_calls" if calls and finish == "stop" else finish
