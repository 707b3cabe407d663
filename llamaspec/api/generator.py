"""The Python API for scripts: `Generator`, built from the same options as `llamaspec run`.

    from llamaspec import Generator

    with Generator("model.gguf", draft="auto", temperature=0, parallel=2) as gen:
        print(gen.generate("Write a haiku about the sea.").text)
        for result in gen.generate_many(["one prompt", "another"]):
            print(result.id, result.finish_reason, result.stats["acceptance"])

Models load once, when the Generator is made, and are freed by `close()` (or the `with` block).
`run` and `batch` are built on it, so a script gets exactly what the commands do: the same
resolution of model references and `draft="auto"`, the same defaults, the same seeds.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from llamaspec.errors import ContextFullError, GenerationInterrupted, LlamaspecError, UsageError  # noqa: F401 (API)
from llamaspec.knobs import DEFAULT as K, DRAFTING, SAMPLING
from llamaspec.api.openai_methods import OpenAIMethods
from llamaspec.api.preparation import Prepared, Preparation, PromptTooLong  # noqa: F401 (API)
from llamaspec.api.request import REQUEST_FIELDS, Prompt, Request, Result  # noqa: F401 (API)
from llamaspec.tune.draft_costs import record_run

if TYPE_CHECKING:
    from llamaspec.api.options import GenerationOptions
    from llamaspec.openai.tools import ToolPlan
    from llamaspec.api.streaming import TextStream


class Generator(Preparation, OpenAIMethods):
    """Loaded target (and draft) with the options of `llamaspec run`; see the module docstring.

    model: a GGUF path or Hub reference (None: the bundled SmolLM2). draft: a path, Hub reference,
    "auto" or None. spec_type: llama.cpp's --spec-type value ("ngram-mod", "draft,ngram-simple").
    Sampling (temperature 0 = greedy), max_tokens and stop are defaults that each request may
    override; max_tokens None (the default) or -1: until end-of-generation or a full context.
    Everything else is fixed for the Generator's life (models load once). tuned: apply
    the configuration `llamaspec tune` stored for these files (settings given here win, one by one).
    n_gpu_layers / n_gpu_layers_draft: layers on the GPU, -1 all; None (default) offloads what fits
    in device memory, as llama.cpp does (`self.pipeline.offload` says what was chosen and why).
    grammar (GBNF) or json_schema: the constraint of every request that sets none (as run's
    --grammar / -j); a request's own grammar, json_schema or tools replace it.

    One generation at a time uses the models (llamaspec/api/ownership.py): a call from another
    thread waits for the running one (or open stream) to end; a second open stream in the same
    thread is a UsageError. After close(), every call and every open stream raises UsageError.
    """

    def __init__(self, model: str | Path | None = None, *, draft: str | Path | None = None,   # (K: knobs.py)
                 spec_type: str | None = None, draft_max: int | None = K.draft_max, draft_min: int = K.draft_min,
                 draft_p_min: float = K.draft_p_min, adaptive: bool = True, ctx_size: int | None = None,
                 threads: int | None = None, n_gpu_layers: int | None = None, n_gpu_layers_draft: int | None = None,
                 amx: bool | None = None, ngram=None, parallel: int = 1,
                 temperature: float = K.temperature, top_k: int = K.top_k, top_p: float = K.top_p,
                 min_p: float = K.min_p, repeat_penalty: float = K.repeat_penalty, repeat_last_n: int = K.repeat_last_n,
                 presence_penalty: float = K.presence_penalty, frequency_penalty: float = K.frequency_penalty,
                 seed: int | None = K.seed, max_tokens: int | None = K.max_tokens, stop: Sequence[str] = (),
                 chat: bool | None = None, system: str | None = None, offline: bool = False, force_draft: bool = False,
                 search: Sequence[Path] = (), tuned: bool = True, spec_replace: Sequence[tuple[str, str]] = (),
                 grammar: str | None = None, json_schema: dict | str | bool | None = None, ignore_eos: bool = False,
                 logit_bias: dict[int, float] | None = None):
        from llamaspec.api.constraints import grammar_of
        from llamaspec.api.options import GenerationOptions
        from llamaspec.speculative.sampling_params import SamplingParams

        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                  repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed)
        self._load(model, GenerationOptions(
            draft=draft, spec_type=spec_type, draft_max=draft_max, draft_min=draft_min, draft_p_min=draft_p_min,
            adaptive=adaptive, ngram=ngram, force_draft=force_draft, search=tuple(search), offline=offline,
            spec_replace=tuple((str(a), str(b)) for a, b in spec_replace),
            ctx_size=ctx_size, threads=threads, n_gpu_layers=n_gpu_layers, n_gpu_layers_draft=n_gpu_layers_draft,
            amx=amx, parallel=parallel, sampling=sampling, max_tokens=max_tokens, stop=stop, chat=chat,
            system=system, grammar=grammar_of(grammar, json_schema), ignore_eos=ignore_eos, logit_bias=logit_bias),
            tuned)

    @classmethod
    def from_options(cls, model: str | Path | None, options: "GenerationOptions", *,
                     tuned: bool = True) -> "Generator":
        """The constructor `run`, `batch` and the server use: the model and one `GenerationOptions`
        (llamaspec/api/options.py, built from the flags by cli/_generation.py)."""
        self = cls.__new__(cls)
        self._load(model, options, tuned)
        return self

    def _load(self, model: str | Path | None, o: "GenerationOptions", tuned: bool) -> None:
        from llamaspec.api.resolve import resolve
        from llamaspec.runtime import wait_policy

        waits = wait_policy.apply(o.threads) or wait_policy.applied()   # before llama.cpp (and OpenMP) loads

        from llamaspec.speculative.options import NgramParams, SpecOptions
        from llamaspec.speculative.pipeline import load_pipeline

        self.generation_options = o
        self.resolved = resolve(None if model is None else str(model), None if o.draft is None else str(o.draft),
                                o.spec_type, offline=o.offline, force_draft=o.force_draft, search=o.search,
                                n_gpu_layers=o.n_gpu_layers)
        r = self.resolved
        # a load-dependent line is detail (run -v, doctor), not a note: output must not follow load
        self.thread_wait = waits
        draft_max = o.draft_max if o.draft_max is not None else r.draft_max
        draft_p_min, ngram = o.draft_p_min, o.ngram or NgramParams()
        # -- a configuration stored by `llamaspec tune` for these files (llamaspec/tune/apply.py):
        # settings the caller set win, one by one; `self.tuned` is the `tuned` object of the stats.
        self.tuned: dict[str, Any] | None = None
        if tuned:
            from llamaspec.tune.apply import apply_tuned

            t = apply_tuned(r.target_path, r.draft_path, r.spec_types, spec_type_given=o.spec_type is not None,
                            draft_given=o.draft is not None and str(o.draft).lower() != "auto", draft_max=draft_max,
                            draft_p_min=draft_p_min, ngram=ngram, n_gpu_layers=o.n_gpu_layers, n_seq=o.parallel)
            if t is not None:
                r.spec_types, draft_max, draft_p_min, ngram, self.tuned = (t.spec_types, t.draft_max,
                                                                           t.draft_p_min, t.ngram, t.info)
                if not t.uses_draft:
                    r.draft_path = r.draft_ref = None
        self.sampling = o.sampling
        self.options = SpecOptions(spec_types=r.spec_types, draft_path=r.draft_path, draft_max=draft_max,
                                   draft_min=o.draft_min, draft_p_min=draft_p_min, adaptive=o.adaptive,
                                   n_ctx=o.ctx_size, n_threads=o.threads, n_gpu_layers=o.n_gpu_layers,
                                   n_gpu_layers_draft=o.n_gpu_layers_draft, ngram=ngram,
                                   amx=o.amx, n_seq=o.parallel, spec_replace=tuple(o.spec_replace),
                                   lazy_draft=r.draft_chosen)
        self.max_tokens, self.stop = o.max_tokens, list(o.stop)
        self.chat, self.system = o.chat, o.system
        self.pipeline = load_pipeline(r.target_path, self.options, self.sampling)
        if o.cache_ram_mib and not self.pipeline.target.needs_checkpoints:   # (a recurrent state is not a prefix)
            from llamaspec.speculative.prompt_cache import PromptCache

            self.pipeline.engine.prompt_cache = PromptCache(o.cache_ram_mib << 20 if o.cache_ram_mib > 0 else 1 << 62)
        if o.logit_bias:   # ids outside the vocabulary: one error now, not one per request
            from llamaspec.api.constraints import check_logit_bias

            check_logit_bias(o.logit_bias, self.pipeline.target.n_vocab)
        if o.grammar is not None:   # a grammar that does not compile: one error now, not one per request
            from llamaspec.api.constraints import check_compiles

            check_compiles(self.pipeline.target, o.grammar)
        from llamaspec.api.ownership import ContextOwner

        self._owner = ContextOwner(self.pipeline.close)

    # -- what was loaded -----------------------------------------------------------------------
    @property
    def spec_label(self) -> str:
        """The drafting types; with a default grammar (--grammar, -j) the grammar drafters that
        join them first (they draft only under a grammar, so otherwise they go unnamed)."""
        from llamaspec.speculative.options import chain_joiners

        types = self.resolved.spec_types
        if self.generation_options.grammar is not None and types and types != ["none"]:
            types = [t for t in chain_joiners() if t not in types] + list(types)
        return ",".join(types) or "none"

    @property
    def notes(self) -> list[str]:
        """One-line notes from resolution (what --draft auto chose and why)."""
        return list(self.resolved.notes)

    @property
    def model_name(self) -> str:
        """The target's file name: what OpenAI-shaped responses and `serve`'s /v1/models call it."""
        return self.resolved.target_path.name

    def _request(self, fields: dict[str, Any]) -> "Request":
        return Request(**fields)

    @property
    def chat_template(self) -> str | None:
        """The target's chat template (Jinja text), None when it has none."""
        return self._pipeline().target.chat_template

    @property
    def n_ctx(self) -> int:
        return self._pipeline().ctx.n_ctx // max(1, self.options.n_seq)

    def describe(self) -> dict[str, Any]:
        """Model, draft and settings: what a batch job's resume check compares."""
        r, o, s = self.resolved, self.options, self.sampling   # (the knobs: the table's, knobs.py)
        o_gen = self.generation_options
        return {"model": str(r.target_path), "model_size": r.target_path.stat().st_size,
                "draft": str(r.draft_path) if r.draft_path else None, "spec_type": r.spec_label,
                **{k: getattr(o, k) for k in DRAFTING}, "adaptive": o.adaptive, "n_ctx": self.n_ctx,
                **{k: getattr(s, k) for k in SAMPLING},
                "max_tokens": self.max_tokens, "stop": self.stop, "chat": self.chat, "system": self.system,
                # (only when set: a job started before these existed resumes)
                **({"ignore_eos": True} if o_gen.ignore_eos else {}),
                **({"logit_bias": {str(k): v for k, v in o_gen.logit_bias.items()}} if o_gen.logit_bias else {})}

    # -- generating ----------------------------------------------------------------------------
    def generate(self, prompt: Prompt | Request, *, on_text: Callable[[str, bool, str], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, stream: bool = False,
                 **fields: Any) -> "Result | TextStream":
        """One generation. on_text(piece, from_draft, drafter) streams the text as it comes.
        stream=True returns a `TextStream` instead: iterate it for the text pieces, then read its
        `result` (llamaspec/api/streaming.py). Keywords are a `Request`'s (max_tokens, temperature,
        seed, stop, json_schema, grammar, logprobs, logit_bias, tools, ...): `generate("Hi",
        temperature=0, max_tokens=8)`; with a Request they override its fields. A prompt longer
        than the context is a UsageError (PromptTooLong)."""
        unknown = sorted(set(fields) - REQUEST_FIELDS)
        if unknown:
            raise TypeError(f"generate() got an unexpected keyword argument {unknown[0]!r}")
        req = prompt if isinstance(prompt, Request) else Request(prompt)
        req = replace(req, **fields) if fields else req
        tokens, config, tools = self.prepare(req)
        if stream:
            from llamaspec.api.streaming import TextStream

            if should_stop is not None:
                raise UsageError("should_stop is for generate without stream", "stop iterating the stream instead")
            return TextStream(self._pipeline().engine, tokens, config, lambda g: self.result(req.id or "0", g, tools),
                              on_text, owner=self._owner, tools=tools)
        asked, closed = [], []   # should_stop said stop: a normal end, not an interrupt

        def stop() -> bool:
            if self._owner.closed:   # close() from another thread: end at this step
                closed.append(True)
            elif should_stop is not None and should_stop():
                asked.append(True)
            return bool(asked or closed)

        engine = self._pipeline().engine
        self._owner.acquire()
        try:
            gen = engine.generate(tokens, config, on_text=on_text, should_stop=stop)
        finally:
            self._owner.release()
        if closed:
            self._owner.check()
        result = self.result(req.id or "0", gen, tools)
        if gen.stop_reason == "interrupted" and not asked:   # the engine caught a KeyboardInterrupt
            raise GenerationInterrupted(result)
        return result

    def generate_many(self, prompts: Iterable[Prompt | Request], *, parallel: int | None = None,
                      should_stop: Callable[[], bool] | None = None) -> Iterator[Result]:
        """Results as they finish (not in input order when parallel > 1; `Result.id` says which:
        the request's id, else its index). parallel: sequences decoded together in one context
        (at most the Generator's `parallel`). A prompt that cannot run (too long for the context, a
        chat template error) gives a Result with `error` set, and the others go on."""
        engine = self._pipeline().engine
        n = self.options.n_seq if parallel is None else parallel
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.options.n_seq:
            raise UsageError(f"parallel must be between 1 and {self.options.n_seq} (the Generator's parallel), "
                             f"not {n!r}")

        failed: list[Result] = []  # prompts that could not be tokenized, reported in turn
        plans: dict[str, "ToolPlan"] = {}   # key -> the tool plan its reply is parsed with

        def jobs():
            for i, p in enumerate(prompts):
                req = p if isinstance(p, Request) else Request(p)
                key = req.id if req.id is not None else str(i)
                try:
                    tokens, config, tools = self.prepare(req)
                except LlamaspecError as e:
                    failed.append(self._failure(key, e))
                    continue
                if tools is not None:
                    plans[key] = tools
                yield key, tokens, config

        def stop() -> bool:
            return self._owner.closed or (should_stop is not None and should_stop())

        runs = engine.generate_many(jobs(), parallel=n, should_stop=stop)
        self._owner.acquire()   # held across the yields: the sequences stay in the context meanwhile
        try:
            for key, gen in runs:
                yield from failed
                failed.clear()
                tools = plans.pop(key, None)
                yield self._failure(key, gen) if isinstance(gen, LlamaspecError) else self.result(key, gen, tools)
                self._owner.check()
        except GenerationInterrupted:
            raise
        except KeyboardInterrupt as e:   # every finished result was yielded; the rest are dropped
            raise GenerationInterrupted(None) from e
        finally:
            runs.close()   # its clean-up uses the context: before release() may free it
            self._owner.release()
        self._owner.check()
        yield from failed

    # -- life cycle ----------------------------------------------------------------------------
    def _pipeline(self):
        from llamaspec.api.ownership import CLOSED

        if getattr(self, "pipeline", None) is None or self._owner.closed:
            raise UsageError(*CLOSED)
        return self.pipeline

    def close(self) -> None:
        """Free the contexts and models (idempotent): now, or when the generation that holds them
        ends (an open stream, another thread's call); from now on every use raises UsageError."""
        owner = getattr(self, "_owner", None)
        if owner is not None and not owner.closed and getattr(self, "pipeline", None) is not None:
            record_run(self)   # what the draft model cost here, for the next run's choice
        if owner is not None:
            owner.close()
        elif getattr(self, "pipeline", None) is not None:   # (a load that failed half way)
            self.pipeline.close()
        self.pipeline = None

    def __enter__(self) -> "Generator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
