"""The one place that turns speculative-type names into drafters (transformers' factory pattern).

Each implemented llama.cpp type name (options.SPEC_TYPES) maps to a builder; several types become
a ChainDrafter in llama.cpp's priority order. Shared code never branches on these names elsewhere:
what a type needs (a draft model, MTP layers) it reads from the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from llamaspec.errors import InputError, UsageError
from llamaspec.speculative.drafters.base import Drafter
from llamaspec.speculative.drafters.chain import ChainDrafter
from llamaspec.speculative.options import MAX_DRAFT, SpecOptions, chain_joiners, parse_spec_types

if TYPE_CHECKING:
    from llamaspec.runtime.llama import Model
    from llamaspec.runtime.context import Context
    from llamaspec.speculative.sampling_params import SamplingParams


@dataclass
class Built:
    drafter: Drafter | None
    draft_model: "Model | None" = None   # loaded here, closed by the pipeline
    more_models: tuple = ()              # a chain's other drafters' models (closed likewise)

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        for m in (self.draft_model, *self.more_models):
            if m is not None:
                m.close()


def _ngram_simple(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.ngram_simple import NgramSimpleDrafter

    return Built(NgramSimpleDrafter(size_n=opts.ngram.simple_size_n, size_m=opts.ngram.simple_size_m))


def _ngram_mod(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.ngram_mod import NgramModDrafter

    g = opts.ngram
    return Built(NgramModDrafter(n_match=g.mod_n_match, n_min=g.mod_n_min, n_max=g.mod_n_max))


def _prompt_lookup(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.prompt_lookup import PromptLookupDrafter

    return Built(PromptLookupDrafter(n_min=opts.ngram.lookup_n_min, n_max=opts.ngram.lookup_n_max,
                                     size_m=MAX_DRAFT, is_stop=target.is_eog))


def _suffix(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.suffix import SuffixDrafter

    return Built(SuffixDrafter(size_m=MAX_DRAFT))


def _draft_model(opts, target, ctx, sampling) -> Built:
    """draft-simple: a draft the default chose loads beside the first steps where a GPU or a free
    core can do it (drafters/lazy.py); a named one, or where every core is the target's, first."""
    from llamaspec.speculative.drafters.lazy import LazyDrafter, decide as lazy_decide
    from llamaspec.speculative.drafters.model import SYNC_WINDOW

    if opts.draft_path is None:
        raise UsageError("--spec-type draft needs a draft model", "pass --draft PATH (or --draft auto)")
    # Decoding one token reads every weight once: sizes estimate the draft's cost per token.
    cost_hint = opts.draft_path.stat().st_size / max(1, target.path.stat().st_size)
    if not (opts.lazy_draft and lazy_decide(opts.n_threads, target.n_gpu_layers)[0]):
        drafter, model = _load_draft_model(opts, target, ctx, sampling, cost_hint)
        # Sizes mislead on CPUs (a Q4 draft of an F16 target: a third of the bytes, nearly the
        # time of a target step here), so the controller starts from timed decodes instead:
        # without them it would learn the cost by drafting, which costs what it learns.
        if ctx.seq_pos_max(0) < 0:
            drafter.measured_cost = drafter.ctx.time_one_token(max(0, target.bos)) / ctx.time_one_token(max(0, target.bos))
        return Built(drafter, model)
    return Built(LazyDrafter(lambda: _load_draft_model(opts, target, ctx, sampling, cost_hint), name="draft-simple",
                             cost_hint=cost_hint, resume_tokens=SYNC_WINDOW))


def _load_draft_model(opts, target, ctx, sampling, cost_hint: float):
    """(drafter, model) of draft-simple: the draft GGUF in a context of its own."""
    from llamaspec.speculative.drafters.model import ModelDrafter
    from llamaspec.runtime.llama import Model
    from llamaspec.runtime.context import Context as Ctx, ContextConfig
    from llamaspec.speculative.verify import target_distribution

    model = Model(opts.draft_path, n_gpu_layers=opts.n_gpu_layers_draft,  # AMX choice: the target's
                  amx=opts.amx if opts.amx is not None else getattr(target, "amx", None))
    try:
        translated = _is_translated(opts, target, model)
        # Another tokenizer may need more tokens for the same text (a quarter more, rounded to 256).
        n_ctx = ctx.n_ctx if not translated else -(-ctx.n_ctx * 5 // 4 // 256) * 256
        dctx = Ctx(model, ContextConfig(n_ctx=n_ctx, n_threads=opts.n_threads, n_seq_max=ctx.config.n_seq_max))
    except BaseException:
        model.close()
        raise
    if translated:
        from llamaspec.speculative.drafters.translated import TranslatedDrafter

        return TranslatedDrafter(target, dctx, p_min=opts.draft_p_min, spec_replace=opts.spec_replace,
                                 cost_hint=cost_hint), model
    # At T > 0 the draft samples from the target's sampling chain applied to its own logits and
    # hands over those probabilities, so verification can use rejection sampling.
    dist = None if sampling.greedy else (lambda row, recent: target_distribution(row, sampling, recent))
    return ModelDrafter(dctx, p_min=opts.draft_p_min, distribution=dist, n_vocab=target.n_vocab,
                        cost_hint=cost_hint), model


def _is_translated(opts, target, model) -> bool:
    """Drafts must go through text when the vocabularies fail llama.cpp's token-exact rules."""
    if opts.translated is not None:
        return opts.translated
    from llamaspec.speculative.drafters.translated import same_vocabulary

    return not same_vocabulary(target, model)


def _layer_reading_draft(opts, target, ctx, kind: str) -> Built:
    """draft-eagle3 / draft-dflash / draft-dspark: a draft GGUF that reads the target's hidden
    layers, in a context linked to the target's."""
    from llamaspec.runtime.llama import Model

    if opts.draft_path is None:
        raise UsageError(f"--spec-type {kind} needs its draft model", "pass --draft PATH")
    model = Model(opts.draft_path, n_gpu_layers=opts.n_gpu_layers_draft,
                  amx=opts.amx if opts.amx is not None else getattr(target, "amx", None))
    cost_hint = opts.draft_path.stat().st_size / max(1, target.path.stat().st_size)
    try:
        if kind == "draft-eagle3":
            from llamaspec.speculative.drafters.eagle3 import Eagle3Drafter as cls
        else:
            from llamaspec.speculative.drafters.dflash import DFlashDrafter as cls
        kw = {} if kind == "draft-eagle3" else {"dspark": kind == "draft-dspark"}
        drafter = cls(target, ctx, model, p_min=opts.draft_p_min, n_threads=opts.n_threads,
                      cost_hint=cost_hint, **kw)
    except BaseException:
        model.close()
        raise
    return Built(drafter, model)


def _eagle3(opts, target, ctx, sampling) -> Built:
    return _layer_reading_draft(opts, target, ctx, "draft-eagle3")


def _dflash(opts, target, ctx, sampling) -> Built:
    return _layer_reading_draft(opts, target, ctx, "draft-dflash")


def _dspark(opts, target, ctx, sampling) -> Built:
    return _layer_reading_draft(opts, target, ctx, "draft-dspark")


def _mtp(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.assistant import is_mtp_draft_file, load_assistant_drafter
    from llamaspec.speculative.drafters.mtp import MtpDrafter

    # --draft names a Gemma 4 assistant: its MTP layers draft (over the target's KV); any other
    # --draft file belongs to draft-simple in the same chain, and the target's own heads draft.
    if is_mtp_draft_file(opts.draft_path):
        drafter, model = load_assistant_drafter(target, ctx, opts.draft_path, p_min=opts.draft_p_min,
                                                n_threads=opts.n_threads, n_gpu_layers=opts.n_gpu_layers_draft,
                                                amx=opts.amx)
        return Built(drafter, model)
    return Built(MtpDrafter(target, ctx, p_min=opts.draft_p_min))


def _ngram_map_k(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.ngram_map import NgramMapKDrafter

    g = opts.ngram
    return Built(NgramMapKDrafter(size_n=g.map_k_size_n, size_m=g.map_k_size_m, min_hits=g.map_k_min_hits))


def _ngram_map_k4v(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.ngram_map import NgramMapK4vDrafter

    g = opts.ngram
    return Built(NgramMapK4vDrafter(size_n=g.map_k4v_size_n, size_m=g.map_k4v_size_m,
                                    min_hits=g.map_k4v_min_hits))


def _ngram_cache(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.ngram_cache import NgramCacheDrafter

    g = opts.ngram
    try:
        return Built(NgramCacheDrafter(static_path=g.cache_static, dynamic_path=g.cache_dynamic,
                                       n_vocab=target.n_vocab))
    except (OSError, ValueError) as e:   # missing, unreadable or corrupt cache file
        raise InputError(str(e), "give an n-gram cache file in llama.cpp's format, or drop "
                                 "--lookup-cache-static/--lookup-cache-dynamic") from None


def _grammar(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.grammar_jump import GrammarJumpDrafter

    return Built(GrammarJumpDrafter(target))


def _grammar_copy(opts, target, ctx, sampling) -> Built:
    from llamaspec.speculative.drafters.grammar_copy import GrammarCopyDrafter

    return Built(GrammarCopyDrafter(target))


_BUILDERS: dict[str, Callable[..., Built]] = {
    "grammar": _grammar,
    "grammar-copy": _grammar_copy,
    "ngram-simple": _ngram_simple,
    "ngram-map-k": _ngram_map_k,
    "ngram-map-k4v": _ngram_map_k4v,
    "ngram-mod": _ngram_mod,
    "ngram-cache": _ngram_cache,
    "prompt-lookup": _prompt_lookup,
    "suffix": _suffix,
    "draft-simple": _draft_model,
    "draft-mtp": _mtp,
    "draft-eagle3": _eagle3,
    "draft-dflash": _dflash,
    "draft-dspark": _dspark,
}


def build_drafter(opts: SpecOptions, target: "Model", ctx: "Context", sampling: "SamplingParams") -> Built:
    """Drafter for opts.spec_types (put in priority order here); None for plain decoding.
    Every drafting set of types gets the chain joiners too (the grammar drafters: no-ops for a
    sequence without a grammar), unless it holds joiners only. Unknown types and types llamaspec
    does not implement are usage errors."""
    built: list[Built] = []
    types = parse_spec_types(opts.spec_types)
    # drafting at all: the grammar drafters join (they draft only under a grammar); a set of
    # joiners only (--spec-type grammar) is taken as given, to measure one alone
    if any(t not in chain_joiners() for t in types):
        types = parse_spec_types(types + chain_joiners())
    try:
        for t in types:
            built.append(_BUILDERS[t](opts, target, ctx, sampling))
    except BaseException:   # a later type refused: free what the earlier ones loaded
        for b in built:
            b.close()
        raise
    if not built:
        return Built(None)
    if len(built) == 1:
        return built[0]
    models = [b.draft_model for b in built if b.draft_model is not None]
    return Built(ChainDrafter([b.drafter for b in built]), models[0] if models else None, tuple(models[1:]))
