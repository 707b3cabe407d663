"""Load a target (and whatever the chosen speculative types need) once, then generate many times.

`SpecOptions` (options.py) is what the user asked for (flags of `run` and `bench`);
`load_pipeline` turns it into loaded models, contexts and one drafter (a chain when several types
are enabled), chosen by the one factory in `drafters/factory.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from llamaspec.errors import UsageError
from llamaspec.knobs import check_draft_min
from llamaspec.runtime.llama import Model
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.devices import plan_offload
from llamaspec.runtime.offload import OffloadDecision
from llamaspec.speculative.drafters.base import Drafter
from llamaspec.speculative.drafters.factory import Built, build_drafter
from llamaspec.speculative.engine import GenerationConfig, SpecEngine
from llamaspec.speculative.options import (DEFAULT_CTX, SpecOptions, default_draft_max, loads_mtp_layers,
                                           needs_draft_model, parse_spec_types)
from llamaspec.speculative.sampling_params import SamplingParams


@dataclass
class Pipeline:
    target: Model
    ctx: Context
    drafter: Drafter | None
    engine: SpecEngine
    options: SpecOptions
    draft_model: Model | None = None
    offload: OffloadDecision | None = None   # the -ngl/-ngld the models were loaded with, and why
    more_draft_models: tuple = ()            # a chain of model drafters: the others' models

    def config(self, **kw) -> GenerationConfig:
        opts = self.options
        draft_max = opts.draft_max if opts.draft_max is not None else default_draft_max(opts.spec_types)
        return GenerationConfig(draft_max=draft_max, draft_min=opts.draft_min, adaptive=opts.adaptive, **kw)

    def close(self, keep_target: bool = False) -> None:
        """Free contexts and the draft model; the target too unless it was passed in to be reused."""
        self.engine.keep_curve()   # what this target's verify batches cost, for the next run
        Built(self.drafter, self.draft_model, self.more_draft_models).close()   # the drafter, then its models
        self.ctx.close()
        if not keep_target:
            self.target.close()


def load_pipeline(target_path: Path, options: SpecOptions, sampling: SamplingParams | None = None,
                  target: Model | None = None) -> Pipeline:
    """Load the target (unless given) and build the drafter for `options.spec_types`."""
    # -ngl/-ngld left at None (auto): offload what fits, as llama.cpp's fit does (runtime/offload.py).
    types = options.spec_types
    if types and options.draft_min:   # against the length the types resolved to
        k = options.draft_max if options.draft_max is not None else default_draft_max(types)
        check_draft_min(options.draft_min, k, flags=True,
                        resolved="" if options.draft_max is not None else f" ({','.join(types)}'s default)")
    draft = options.draft_path if needs_draft_model(types) or loads_mtp_layers(types) else None
    offload = plan_offload(target_path, draft, n_gpu_layers=options.n_gpu_layers,
                           n_gpu_layers_draft=options.n_gpu_layers_draft, n_ctx=options.n_ctx,
                           default_ctx=DEFAULT_CTX, n_seq=options.n_seq, load_mtp=loads_mtp_layers(types),
                           target_loaded=target is not None)
    placed = replace(options, n_gpu_layers=offload.n_gpu_layers, n_gpu_layers_draft=offload.n_gpu_layers_draft)
    if target is None:  # all in RAM: refuse a context that would end in an OOM kill (runtime/memory.py)
        from llamaspec.runtime.memory import check_load

        check_load(Path(target_path), draft, n_ctx=options.n_ctx, default_ctx=DEFAULT_CTX, n_seq=options.n_seq,
                   load_mtp=loads_mtp_layers(types), on_gpu=offload.n_gpu_layers != 0)
    owned = target is None
    if owned:
        target = Model(target_path, n_gpu_layers=placed.n_gpu_layers,
                       load_mtp=loads_mtp_layers(options.spec_types), amx=options.amx)
    try:
        return _build(target, options, placed, offload, sampling)
    except BaseException:   # a refused draft, a context that cannot be made: free the target now
        if owned:
            target.close()
        raise


def _build(target: Model, options: SpecOptions, placed: SpecOptions, offload, sampling) -> Pipeline:
    n_ctx = options.n_ctx
    if n_ctx is None:  # past the training context a model degrades; llama.cpp warns about it
        n_ctx = min(DEFAULT_CTX, target.n_ctx_train) if target.n_ctx_train > 0 else DEFAULT_CTX
    elif n_ctx == 0:
        n_ctx = target.n_ctx_train
    # llama.cpp pads the context to a multiple of 256 but caps n_batch at the size asked: ask for
    # the padded size, so that a batch never outgrows n_batch (-c 8 with a longer prompt aborted).
    n_ctx = -(-max(1, n_ctx) // 256) * 256
    if options.n_seq > 1 and loads_mtp_layers(options.spec_types):
        raise UsageError("--parallel with MTP drafting is not supported yet",
                         "use --parallel 1 with --spec-type mtp, or another spec type")
    # n_ctx is per sequence: llama.cpp gives each of n_seq_max sequences n_ctx / n_seq_max.
    # Nothing drafted (--spec-type none): one row per sequence per step, where a split cache is
    # faster (runtime/context.py); any drafting keeps the unified one (verify rows of any lengths).
    ctx = Context(target, ContextConfig(n_ctx=n_ctx * options.n_seq, n_threads=options.n_threads,
                                        n_seq_max=options.n_seq, kv_unified=bool(parse_spec_types(options.spec_types))))
    try:
        built = build_drafter(placed, target, ctx, sampling or SamplingParams(temperature=0.0))
    except BaseException:
        ctx.close()
        raise
    engine = SpecEngine(target, ctx, built.drafter)
    return Pipeline(target, ctx, built.drafter, engine, options, built.draft_model, offload, built.more_models)
