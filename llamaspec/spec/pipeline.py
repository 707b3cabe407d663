"""Load a target (and whatever the chosen speculative types need) once, then generate many times.

`SpecOptions` is what the user asked for (flags of `run` and `bench`); `load_pipeline` turns
it into loaded models, contexts and one drafter (a chain when several types are enabled), chosen
by the one factory in `drafters/factory.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from llamaspec.spec.drafters.base import Drafter
from llamaspec.spec.drafters.chain import order_by_priority
from llamaspec.spec.engine import GenerationConfig, SpecEngine
from llamaspec.errors import UsageError
from llamaspec.runtime.llama import Context, ContextConfig, Model
from llamaspec.spec.verify import SamplingParams


@dataclass
class NgramParams:
    """n-gram drafter settings, llama.cpp's --spec-ngram-* flags.

    llamaspec's defaults are shorter than llama.cpp's (ngram-simple size-n 12, ngram-mod n-match 24
    / n-min 48): the adaptive draft length bounds what a wrong draft costs, so drafting can start
    after a shorter match. Measured on SmolLM2 F16, code-rewrite prompt, 256 tokens, 3 reps:
    ngram-simple 1.51x at size-n 12 -> 1.92x at 6; ngram-mod 1.33x at 24/48 -> 1.75x at 6/4,
    tokens identical to plain decoding in every run.
    """

    simple_size_n: int = 6      # llama.cpp: 12
    simple_size_m: int = 48
    mod_n_match: int = 6        # llama.cpp: 24
    mod_n_min: int = 4          # llama.cpp: 48
    mod_n_max: int = 64

    def native_flags(self) -> list[str]:
        """The same settings as llama.cpp command-line flags (for side-by-side benchmarks)."""
        return ["--spec-ngram-simple-size-n", str(self.simple_size_n),
                "--spec-ngram-simple-size-m", str(self.simple_size_m),
                "--spec-ngram-mod-n-match", str(self.mod_n_match),
                "--spec-ngram-mod-n-min", str(self.mod_n_min),
                "--spec-ngram-mod-n-max", str(self.mod_n_max)]


@dataclass
class SpecOptions:
    spec_types: list[str] = field(default_factory=list)   # llama.cpp names, priority-ordered
    draft_path: Path | None = None
    draft_max: int | None = None
    draft_min: int = 0
    draft_p_min: float = 0.0
    adaptive: bool = True
    n_ctx: int | None = None   # None: 4096, or the model's training context if smaller; 0: training context
    n_threads: int | None = None
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    ngram: NgramParams = field(default_factory=NgramParams)
    amx: bool | None = None    # --amx / --no-amx; None: LLAMASPEC_AMX or the default (cpu_policy.py)


DEFAULT_CTX = 4096

# A verify batch is the last token + the draft, and must fit one llama.cpp batch (n_batch): only
# the last chunk of a longer batch has output rows.
MAX_DRAFT = ContextConfig.n_batch - 1

# Draft length caps when the user gives none: n-gram drafts cost nothing to make, so long ones
# pay when the text repeats (measured on SmolLM2: k=32 won on an easy rewrite, 3.2x against 2.7x at k=8); a draft model pays per token.
DEFAULT_DRAFT_MAX = {"ngram": 32, "model": 8}


def parse_spec_types(value: str | Sequence[str] | None) -> list[str]:
    """`--spec-type` value (comma list, llama.cpp names or aliases) -> canonical names in priority order."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else [v for s in value for v in s.split(",")]
    try:
        return order_by_priority([i for i in items if i.strip()])
    except ValueError as e:
        raise UsageError(str(e), "e.g. --spec-type ngram-mod or --spec-type draft,ngram-simple") from None


def default_draft_max(spec_types: Sequence[str]) -> int:
    if any(t.startswith("draft-") for t in spec_types):
        return DEFAULT_DRAFT_MAX["model"]
    return DEFAULT_DRAFT_MAX["ngram"]


@dataclass
class Pipeline:
    target: Model
    ctx: Context
    drafter: Drafter | None
    engine: SpecEngine
    options: SpecOptions
    draft_model: Model | None = None

    def config(self, **kw) -> GenerationConfig:
        opts = self.options
        draft_max = opts.draft_max if opts.draft_max is not None else default_draft_max(opts.spec_types)
        return GenerationConfig(draft_max=draft_max, draft_min=opts.draft_min, adaptive=opts.adaptive, **kw)

    def close(self, keep_target: bool = False) -> None:
        """Free contexts and the draft model; the target too unless it was passed in to be reused."""
        if self.drafter is not None:
            self.drafter.close()
        if self.draft_model is not None:
            self.draft_model.close()
        self.ctx.close()
        if not keep_target:
            self.target.close()


def load_pipeline(target_path: Path, options: SpecOptions, sampling: SamplingParams | None = None,
                  target: Model | None = None) -> Pipeline:
    """Load the target (unless given) and build the drafter for `options.spec_types`."""
    from llamaspec.spec.drafters.factory import build_drafter

    if target is None:
        target = Model(target_path, n_gpu_layers=options.n_gpu_layers,
                       load_mtp="draft-mtp" in options.spec_types, amx=options.amx)
    n_ctx = options.n_ctx
    if n_ctx is None:  # past the training context a model degrades; llama.cpp warns about it
        n_ctx = min(DEFAULT_CTX, target.n_ctx_train) if target.n_ctx_train > 0 else DEFAULT_CTX
    ctx = Context(target, ContextConfig(n_ctx=n_ctx, n_threads=options.n_threads))
    built = build_drafter(options, target, ctx, sampling or SamplingParams(temperature=0.0))
    engine = SpecEngine(target, ctx, built.drafter)
    return Pipeline(target, ctx, built.drafter, engine, options, built.draft_model)
