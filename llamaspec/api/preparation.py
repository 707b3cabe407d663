"""A request into the engine and the engine's output back: the half of `Generator` between the
caller and the engine (generator.py holds the models, the calls and the life cycle).

`Preparation.prepare(req)` turns a `Request` into (prompt tokens, the engine's config, the tool
plan) or the UsageError that says why it cannot run, its settings over the Generator's;
`Preparation.result(key, gen, tools)` turns a finished generation into a `Result`. The server's
preparing threads and scheduler call both (serve/job.py, serve/scheduler.py).

A mixin: it reads the Generator's loaded state (`_pipeline()`, `_owner`, `sampling`, `max_tokens`,
`stop`, `chat`, `system`, `generation_options`, `options`, `resolved`, `spec_label`, `tuned`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from llamaspec.api.request import Prompt, Request, Result, finish_reason
from llamaspec.errors import ContextFullError, LlamaspecError, UsageError

if TYPE_CHECKING:
    from llamaspec.openai.tools import ToolPlan


class Prepared(NamedTuple):
    """A request ready to run: its prompt tokens, the engine's config, and the tool plan whose
    calls its reply is parsed for (None: no tools to call)."""

    tokens: list[int]
    config: Any
    tools: "ToolPlan | None"


class PromptTooLong(UsageError, ContextFullError):
    """A prompt longer than the context: `run`'s one-line error (a UsageError; a ContextFullError
    too, for scripts that caught the engine's). Exit code 1 as run's: the input is wrong."""

    exit_code = ContextFullError.exit_code


def prompt_too_long(n_prompt: int, n_ctx: int, given: int | None) -> PromptTooLong:
    asked = "" if given is None or given == n_ctx else f" (-c {given}, rounded up by llama.cpp)"
    return PromptTooLong(f"the prompt is {n_prompt:,} tokens, longer than the context of {n_ctx:,} tokens{asked}",
                         f"raise -c/--ctx-size (ctx_size) to at least {n_prompt + 1:,}, or shorten the prompt")


#: a Request's fields that the one parser checks (openai/requests.py: as a body's, same messages)
CHECKED = ("max_tokens", *Request.SAMPLING, "stop", "ignore_eos", "logit_bias", "grammar", "json_schema", "logprobs")


def checked(req: Request) -> Request:
    """The Request with its fields as the server's parser checks and reads them (its RequestError
    naming the field): max_tokens -1 as no limit, an empty stop list as none of its own, grammar
    or json_schema as one GrammarSpec in `grammar`. A GrammarSpec given as grammar is kept."""
    from llamaspec.openai.requests import check_fields
    from llamaspec.openai.response_format import one_constraint
    from llamaspec.runtime.grammar import GrammarSpec

    spec = req.grammar if isinstance(req.grammar, GrammarSpec) else None
    given = {k: getattr(req, k) for k in CHECKED if getattr(req, k) is not None and getattr(req, k) is not spec}
    fields = dict(json_schema=None, logit_bias=None, ignore_eos=False, logprobs=None, grammar=spec)
    fields.update(check_fields(given))
    if spec is not None and fields["grammar"] is not spec:
        one_constraint([spec.field or "grammar", fields["grammar"].field or "json_schema"])
    return replace(req, **fields)


class Preparation:
    """Generator's preparing and result-making methods (see the module docstring)."""

    def tokenize(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Prompt tokens as `run` makes them: the chat template by default when the model has one."""
        with self._owner.reading():   # close() does not free the model under the tokenizer
            return self._tokenize(self._pipeline().target, prompt, chat)

    def _tokenize(self, target, prompt: Prompt, chat: bool | None, tools: "ToolPlan | None" = None) -> list[int]:
        """tools: the plan that renders the request's tools (in the template, or as its fallback)."""
        from llamaspec.openai.requests import parse_messages   # the one message parser (server, batch too)

        if isinstance(prompt, Request):
            raise UsageError("tokenize takes the prompt, not a Request", "pass request.prompt")
        if not isinstance(prompt, str) and not isinstance(prompt, (list, tuple)):
            raise UsageError(f"prompt must be text or a list of chat messages, not {type(prompt).__name__}", field="prompt")
        if isinstance(prompt, str):
            chat = self.chat if chat is None else chat
            use_chat = chat if chat is not None else target.chat_template is not None
            if not use_chat:
                if tools is not None:
                    raise UsageError("tools need chat mode (the chat template renders them)",
                                     "drop --raw / chat=False, or send chat messages", field="tools")
                if self.system:
                    raise UsageError("--system needs chat mode", "drop --raw, or put the system text in the prompt")
                return target.tokenize_prompt(prompt)
            messages = ([{"role": "system", "content": self.system}] if self.system else []) + [
                {"role": "user", "content": prompt}]
        else:
            messages = parse_messages(prompt)
            if self.system and not any(m.get("role") == "system" for m in messages):
                messages.insert(0, {"role": "system", "content": self.system})
        if tools is None:
            return target.tokenize_prompt(target.chat_prompt(messages))
        return target.tokenize_prompt(target.chat_prompt(tools.messages(messages), **tools.template_kwargs))

    def _config(self, req: Request, structured):
        """The engine's config for one checked request (`checked`): its own settings over the
        Generator's. structured: its grammar, logit bias and logprobs against the model (constraints.py)."""
        overrides = {k: getattr(req, k) for k in Request.SAMPLING if getattr(req, k) is not None}
        sampling = replace(self.sampling, **overrides) if overrides else self.sampling
        max_tokens = self.max_tokens if req.max_tokens is None else req.max_tokens
        stop = list(self.stop if req.stop is None else req.stop)
        pipeline = self._pipeline()
        return pipeline.config(max_tokens=max_tokens, sampling=sampling, stop=stop, ignore_eos=bool(req.ignore_eos),
                               **structured.config_fields())

    def prepare(self, req: Request, fit: bool = True) -> Prepared:
        """(tokens, config, tool plan) of a request, or the UsageError that says why it cannot run.
        The server's preparing threads call it too, with fit=False: it says a prompt is too long its way."""
        from llamaspec.api.constraints import constraints

        for name, kind in (("id", str), ("chat", bool)):
            if getattr(req, name) is not None and not isinstance(getattr(req, name), kind):
                raise UsageError(f"{name} must be {'a string' if kind is str else 'True or False'} or None, "
                                 f"not {getattr(req, name)!r}", field=name)
        req = checked(req)
        own = self.generation_options   # the Generator's (run's / serve's flags) where the request sets none
        if own.ignore_eos or (own.logit_bias and req.logit_bias is None):
            req = replace(req, ignore_eos=req.ignore_eos or own.ignore_eos,
                          logit_bias=own.logit_bias if req.logit_bias is None else req.logit_bias)
        with self._owner.reading():   # close() does not free the model meanwhile
            target = self._pipeline().target
            structured = constraints(req, target, self.generation_options.grammar, target.chat_template)
            tokens = self._tokenize(target, req.prompt, req.chat, structured.plan)
        config = self._config(req, structured)
        if fit and len(tokens) > self.n_ctx:
            raise prompt_too_long(len(tokens), self.n_ctx, self.options.n_ctx)
        return Prepared(tokens, config, structured.plan if structured.calls else None)

    @staticmethod
    def _failure(key: str, error: LlamaspecError) -> Result:
        return Result(key, "", [], "error", "error", 0, {}, error)

    def result(self, key: str, gen, tools: "ToolPlan | None" = None) -> Result:
        """The Result of a finished generation; tools: the plan its calls are parsed with."""
        from llamaspec.api.constraints import tool_reply
        from llamaspec.speculative.report import generation_dict

        stats = generation_dict(gen, spec_type=self.spec_label, draft_model=self.resolved.draft_ref,
                                model=self.resolved.target_ref)
        for k in ("text", "tokens", "stop_reason"):
            stats.pop(k, None)
        stats["tuned"] = self.tuned   # the stored `tune` configuration applied, or None
        content, calls, finish = gen.text, None, finish_reason(gen.stop_reason)
        if tools is not None:
            content, calls, finish = tool_reply(tools, gen.text, finish)
        return Result(key, gen.text, gen.tokens, finish, gen.stop_reason, gen.n_prompt, stats,
                      logprobs=gen.logprobs, tool_calls=calls, content=content)
