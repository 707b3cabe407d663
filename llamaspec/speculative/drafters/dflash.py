"""`draft-dflash` and `draft-dspark`: block-diffusion drafts that propose a whole block in one pass.

DFlash (llama.cpp's `common_speculative_impl_draft_dflash`, `src/models/dflash.cpp`):

* The target context extracts the inputs of the draft's `dflash.target_layers` for every token.
* Injection: an embedding-only batch of those feature rows, at the target's positions, runs the
  draft's `fc` + norm and writes K/V of every draft layer straight into the draft KV cache (no
  outputs). The draft KV thus mirrors the target's context.
* Drafting: one decode of the block [last token, mask, mask, ...] at positions n, n+1, ... with
  non-causal attention (unless `dflash.attention.causal`) over the injected context and the
  block. Position i's logits give the token at n+i: drafts are read from positions 1.. (at most
  block_size - 1 tokens). Greedy top-1, stopping below p_min (top-10 probability, llama.cpp's).
* DSpark = DFlash + a Markov head: each block position's logits get a low-rank bias from the
  previous position's argmax, chained in the graph. Anchor-first blocks (`sample_from_anchor`,
  the default) read drafts from position 0 on (block_size tokens); p_min is compared with the
  confidence head's output (`llama_get_embeddings_nextn`, first value of each row), and needs it.

Keeping the draft in step (one sequence): the target's feature rows are buffered per decode
(`FeatureTap`, eagle3.py) and injected at `propose` for the confirmed positions not injected yet,
so rejected verify rows never reach the draft KV; the block's rows are removed after drafting.
Rows whose token changed (a new prompt on the sequence) are cut by comparing tokens.
DFlash2 drafts (a candidate-selector lattice, `dflash.selector_top_k`) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

import llama_cpp

from llamaspec.errors import UsageError
from llamaspec.gguf.header import read_file
from llamaspec.runtime import ext
from llamaspec.runtime.context import Context
from llamaspec.runtime.llama import Model
from llamaspec.speculative.drafters.base import Draft, Drafter
from llamaspec.speculative.drafters.eagle3 import (
    FeatureTap, check_layers, check_runtime, check_single_sequence, draft_context, pick, process_or_raise,
)
from llamaspec.speculative.prefix import common_prefix

_EXTRA = ("llama_set_causal_attn", "llama_vocab_mask", "llama_model_dflash_selector_top_k")


@dataclass
class _Seq:
    n_done: int = 0                                  # draft KV holds injected rows 0..n_done-1
    toks: list[int] = field(default_factory=list)    # the tokens at those positions


class DFlashDrafter(Drafter):
    def __init__(self, target: Model, tctx: Context, draft: Model, *, dspark: bool = False, p_min: float = 0.0,
                 n_threads: int | None = None, cost_hint: float = 0.0):
        self.name = "draft-dspark" if dspark else "draft-dflash"
        check_runtime(self.name, _EXTRA)
        check_single_sequence(self.name, tctx)
        if draft.meta("general.architecture") != "dflash":
            raise UsageError(f"{draft.path.name} is not a DFlash/DSpark draft (architecture "
                             f"{draft.meta('general.architecture')!r})", "check the file, or use --spec-type draft-eagle3")
        has_markov = any(t.name == "markov_w1.weight" for t in read_file(draft.path).tensors)
        if has_markov != dspark:
            other = "draft-dspark" if has_markov else "draft-dflash"
            raise UsageError(f"{draft.path.name} is a {other[6:]} draft ({'a' if has_markov else 'no'} Markov head)",
                             f"use --spec-type {other}")
        if ext.dflash_selector_top_k(draft.ptr) > 0:
            raise UsageError(f"{draft.path.name} is a DFlash2 draft (candidate-selector lattice): llamaspec does not "
                             "read its lattice yet", "use a DFlash or DSpark draft without a selector")
        self.layer_ids = ext.target_layer_ids(draft.ptr)
        check_layers(self.name, draft, target, self.layer_ids)
        n_embd = int(llama_cpp.llama_model_n_embd(draft.ptr))
        if n_embd != target.n_embd:  # llama.cpp sizes the feature input from the draft's width
            raise UsageError(f"{draft.path.name} has width {n_embd}; {target.path.name} has {target.n_embd}",
                             f"use the {self.name[6:]} draft trained for this target")
        self.mask = ext.vocab_mask(draft.vocab)
        if self.mask < 0:
            raise UsageError(f"{draft.path.name} has no mask token (tokenizer.ggml.mask_token_id)",
                             "reconvert the draft with llama.cpp's convert_hf_to_gguf.py")
        block = draft.meta("dflash.block_size")
        self.block_size = int(block) if block else 16
        anchor = draft.meta("dflash.sample_from_anchor")
        self.anchor_first = dspark and anchor in (None, "true")
        # [last, mask * (block - 1)] denoises at most block - 1 tokens; anchor-first DSpark a full block
        self.n_cap = self.block_size if self.anchor_first else self.block_size - 1
        self.p_min = max(0.0, float(p_min))
        if dspark and self.p_min > 0.0 and draft.meta("dflash.has_confidence_head") not in (None, "true"):
            raise UsageError(f"{draft.path.name} has no confidence head, which --draft-p-min needs with DSpark",
                             "pass --draft-p-min 0")
        self.cost_hint = cost_hint
        self.n_vocab, self.n_embd = target.n_vocab, n_embd
        self.ctx = draft_context(draft, tctx, n_threads)
        ext.set_embeddings_nextn(self.ctx.ptr, True, True)  # DSpark's confidences, one row per output
        llama_cpp.llama_set_causal_attn(self.ctx.ptr, draft.meta("dflash.attention.causal") == "true")
        self.batch = ext.ExtBatch(self.ctx.ptr)
        self.tap = FeatureTap(tctx, self.layer_ids, target.n_embd)
        self._seqs: dict[int, _Seq] = {}

    def _inject(self, seq_id: int, feats: np.ndarray, p0: int) -> None:
        """K/V of the target's feature rows at positions p0.. into the draft KV (no outputs)."""
        for i in range(0, len(feats), self.ctx.n_batch):
            chunk = np.ascontiguousarray(feats[i:i + self.ctx.n_batch], dtype=np.float32)
            self.batch.clear()
            for j in range(len(chunk)):
                self.batch.add_embd(seq_id, chunk[j], p0 + i + j, False)
            process_or_raise(self.batch, f"{self.name} injection")

    def reuse_prefix(self, seq_id: int, prompt_tokens: Sequence[int], keep: int) -> int:
        # Injected rows stay where their tokens match the new prompt; the features from there on
        # come from the tap if it still holds them for these tokens, else from the target again.
        s = self._seqs.setdefault(seq_id, _Seq())
        s.n_done = common_prefix(s.toks, prompt_tokens)
        del s.toks[s.n_done:]
        self.ctx.seq_rm(seq_id, s.n_done, -1)
        return keep if self.tap.reuse(seq_id, prompt_tokens, s.n_done, keep) else min(keep, s.n_done)

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        n = len(history) - 1                  # position of the last token (not in the target KV)
        n_max = min(n_max, self.n_cap, self.ctx.n_ctx_seq - n - 1 - (0 if self.anchor_first else 1))
        if n_max <= 0 or n < 1:
            return Draft([])
        s = self._seqs.setdefault(seq_id, _Seq())
        # An injected row at P depends on the tokens 0..P: keep the rows whose tokens still match.
        s.n_done = common_prefix(s.toks, history, limit=n)
        feats = self.tap.get(seq_id, s.n_done, n, history) if s.n_done < n else np.empty((0, 0), np.float32)
        if feats is None:
            return Draft([])
        tokens: list[int] = []
        self.ctx.seq_rm(seq_id, s.n_done, -1)
        try:
            self._inject(seq_id, feats, s.n_done)
            s.n_done, s.toks = n, list(history[:n])
            n_block = n_max if self.anchor_first else n_max + 1
            self.batch.clear()
            for i in range(n_block):
                self.batch.add_token(seq_id, history[n] if i == 0 else self.mask, n + i, True)
            process_or_raise(self.batch, f"{self.name} block")
            conf = None
            if self.name == "draft-dspark" and self.p_min > 0.0:
                conf = ext.rows(ext.get_embeddings_nextn(self.ctx.ptr), n_block, self.n_embd)[:, 0].copy()
            for i in range(0 if self.anchor_first else 1, n_block):
                if conf is not None and conf[i] < self.p_min:
                    break
                tok = pick(self.ctx.ptr, i, self.n_vocab, self.p_min if conf is None else 0.0)
                if tok is None:
                    break
                tokens.append(tok)
        finally:
            self.ctx.seq_rm(seq_id, n, -1)  # the block was only for drafting
            self.tap.trim(seq_id, s.n_done)
        return Draft(tokens, None, self.name) if tokens else Draft([])

    def end(self, seq_id: int) -> None:
        # Injected rows are kept: the next prompt on this sequence may reuse the target's cached
        # prefix, and then they are still right (checked by token).
        pass

    def close(self) -> None:
        self.tap.close()
        self.batch.close()
        self.ctx.close()
        self._seqs.clear()
