"""`draft-simple` with a draft model of another vocabulary: drafts translated through text.

llama.cpp's server once did this (universal assisted decoding, ggml-org/llama.cpp#12635, dropped
by the 2026 speculative refactor); transformers calls it Universal Assisted Generation. The
target's tokens stay the truth, and the draft sees text:

  sync     the target's new tokens are rendered (special tokens as their text, the target's BOS
           left out, and the leading space a SentencePiece target added to the prompt) and
           appended to the sequence's text; only a short tail of it is tokenized again for the
           draft (the last KEEP_TAIL draft tokens and the new text: a word the new text continues
           may merge into other tokens), and the draft's KV cache is cut where its tokens changed
           (translated_text.tokenize_tail). Tokenizers that add a leading space tokenize such a
           window after a sentinel (translated_text.Encoder), so a window never starts with a
           space the text does not have. `--spec-replace TARGET DRAFT` strings (chat template
           tags) are replaced in the text the draft sees.
  draft    the draft model drafts greedily, one token per decode, as draft-simple does.
  back     the drafted text (with the replacements undone) is tokenized with the target's
           tokenizer after the target's last tokens; the target tokens fully inside the drafted
           text and consistent with the target's own tokens are the draft
           (translated_text.draft_to_target).

The draft's KV outlives a request, as ModelDrafter's does: the next prompt on the sequence (a
chat's next turn) keeps the draft tokens inside the text both share. A recurrent or hybrid draft
(whose memory cannot be cut) keeps a checkpoint (Context.save_seq) where the next re-tokenized
window starts, and rolls back to it instead of evaluating the whole text again.

Verification is the engine's, unchanged: greedy output is the target's own. The drafter gives no
probabilities (a distribution over the draft's vocabulary says nothing about the target's
tokens), so at T > 0 the engine verifies by sample-and-match.
"""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import llama_cpp
import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter
from llamaspec.speculative.drafters.model import GAP, SYNC_WINDOW, roll_back, top_probability
from llamaspec.speculative.drafters.translated_text import (
    Encoder, complete_utf8_len, draft_to_target, replace_with_offsets, restart_index, reverse_pairs, tokenize_tail)
from llamaspec.speculative.prefix import common_prefix

if TYPE_CHECKING:
    from llamaspec.runtime.context import Context
    from llamaspec.runtime.llama import Model

#: draft tokens at the end of the text tokenized again when the text grows
KEEP_TAIL = 4
#: target tokens before the drafted text, tokenized with it to find where the draft's tokens start
CONTEXT_TOKENS = 6
#: llama.cpp's rules (common_speculative_are_compatible): ids from 5 on, sizes within 128
_CHECK_START, _MAX_SIZE_DIFFERENCE = 5, 128


def _raw_tokens(path) -> bytes | None:
    """The raw bytes of a GGUF's token list (for a fast equality check), None if unreadable."""
    from llamaspec.gguf.peek import skip_strings, tokens_array

    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            start, count = tokens_array(mm)
            return bytes(mm[start:skip_strings(mm, start, count, len(mm))])
    except (OSError, ValueError, IndexError):
        return None


def same_vocabulary(target: "Model", draft: "Model") -> bool:
    """llama.cpp's token-exact rules on two loaded models (what llama.cpp checks at load time):
    False means the draft's token ids mean nothing to the target, and drafting must translate."""
    tv, dv = target.vocab, draft.vocab
    if llama_cpp.llama_vocab_type(tv) != llama_cpp.llama_vocab_type(dv):
        return False
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos != draft.bos):
        return False
    t_eos, d_eos = bool(llama_cpp.llama_vocab_get_add_eos(tv)), bool(llama_cpp.llama_vocab_get_add_eos(dv))
    if t_eos != d_eos or (t_eos and target.eos != draft.eos):
        return False
    if abs(target.n_vocab - draft.n_vocab) > _MAX_SIZE_DIFFERENCE:
        return False
    if target.n_vocab == draft.n_vocab:
        a, b = _raw_tokens(target.path), _raw_tokens(draft.path)
        if a is not None and a == b:   # the common case, at memcmp speed
            return True
    text = llama_cpp.llama_vocab_get_text
    return all(text(tv, i) == text(dv, i) for i in range(_CHECK_START, min(target.n_vocab, draft.n_vocab)))


class _Pieces:
    """Token -> bytes with special tokens rendered as their text (chat tags must reach the other
    model as text), cached."""

    def __init__(self, model: "Model"):
        self.model = model
        self.cache: dict[int, bytes] = {}
        self.buf = ctypes.create_string_buffer(256)

    def __call__(self, token: int) -> bytes:
        p = self.cache.get(token)
        if p is None:
            n = llama_cpp.llama_token_to_piece(self.model.vocab, token, self.buf, len(self.buf), 0, True)
            if n < 0:
                big = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.model.vocab, token, big, -n, 0, True)
                p = big.raw[:n]
            else:
                p = self.buf.raw[:n]
            self.cache[token] = p
        return p


@dataclass
class _Seq:
    n_hist: int = 0                                   # target tokens rendered into `text`
    text: str = ""                                    # the target's text (BOS left out)
    pending: bytes = b""                              # an incomplete UTF-8 character at its end
    toks: list[int] = field(default_factory=list)     # the draft's tokens for `text`
    ends: list = field(default_factory=list)          # where each one ends in `text` (None: unclear)
    cached: list[int] = field(default_factory=list)   # tokens in the draft's KV (GAP: skipped)
    shift: int = 0                                    # positions skipped by catch-up splices
    floor: int = 0                                    # tokens that are never tokenized again
    checkpoint: tuple[int, bytearray] | None = None   # recurrent drafts: (tokens, state) of cached[:n]


def _common_prefix_len(a: str, b: str) -> int:
    """Length of the common prefix of two strings (slice compares: C speed on long texts)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class TranslatedDrafter(Drafter):
    """A draft model of another vocabulary (see the module docstring)."""

    name = "draft-simple"
    samples = False
    translated = True

    def __init__(self, target: "Model", ctx: "Context", *, p_min: float = 0.0,
                 spec_replace: Sequence[tuple[str, str]] = (), cost_hint: float = 0.0):
        """target: the target model (its tokenizer); ctx: the draft model's context.
        spec_replace: (target text, draft text) pairs, replaced in the text the draft sees and back
        in its drafts."""
        self.target, self.ctx, self.draft = target, ctx, ctx.model
        self.p_min = p_min
        self.pairs = [(a, b) for a, b in spec_replace if a]
        self.back = reverse_pairs(self.pairs)
        self.cost_hint = cost_hint
        self._tpiece, self._dpiece = _Pieces(target), _Pieces(self.draft)
        self._tenc, self._denc = Encoder(self._ttokenize, self._tpiece), Encoder(self._dtokenize, self._dpiece)
        self._seqs: dict[int, _Seq] = {}

    # -- the two tokenizers --------------------------------------------------------------------
    def _dtokenize(self, text: str) -> list[int]:
        return self.draft.tokenize(text, add_special=False, parse_special=True)

    def _ttokenize(self, text: str) -> list[int]:
        return self.target.tokenize(text, add_special=False, parse_special=True)

    def _fresh(self) -> _Seq:
        st = _Seq()
        if self.draft.add_bos and self.draft.bos >= 0:   # the draft's own BOS, never re-tokenized
            st.toks, st.ends, st.floor = [self.draft.bos], [0], 1
        return st

    def _new_seq(self, seq_id: int) -> _Seq:
        self.ctx.seq_rm(seq_id, 0, -1)
        st = self._seqs[seq_id] = self._fresh()
        return st

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        """Evaluate the prompt's text in the draft now: it is prompt processing, timed as such.
        The draft tokens of the text this prompt shares with the sequence's previous one stay
        (their KV too): a chat's next turn evaluates its new text only."""
        old = self._seqs.get(seq_id)
        if old is None or old.shift:   # a spliced record has no text for its skipped positions
            st = self._new_seq(seq_id)
            self._append(st, prompt_tokens)
        else:
            st = self._seqs[seq_id] = self._fresh()
            self._append(st, prompt_tokens)
            n = _common_prefix_len(old.text, st.text)
            k = len(old.ends)
            while k > old.floor and (old.ends[k - 1] is None or old.ends[k - 1] > n):
                k -= 1
            st.toks, st.ends = old.toks[:k], old.ends[:k]
            st.cached, st.checkpoint = old.cached, old.checkpoint
        if len(prompt_tokens) > 1 and not st.pending and st.text:
            self._catch_up(st, seq_id)

    # -- keeping the draft's KV on the text ----------------------------------------------------
    def _append(self, st: _Seq, history: Sequence[int]) -> None:
        """Render the target's new tokens into st.text."""
        new = [t for t in history[st.n_hist:] if t != self.target.bos]
        data = b"".join(self._tpiece(t) for t in new)
        prefix = self._tenc.prefix
        if st.n_hist == 0 and new and prefix and self.target.piece(new[0]).startswith(prefix):
            data = data[len(prefix):]   # the space the target's tokenizer put before the prompt
        st.n_hist = len(history)
        data = st.pending + data
        cut = complete_utf8_len(data)
        st.text += data[:cut].decode("utf-8", errors="replace")
        st.pending = data[cut:]

    def _sync(self, st: _Seq, seq_id: int, history: Sequence[int]) -> bool:
        """Bring the draft's tokens and KV to the text of `history`, with the logits of its last
        token ready. False when there is nothing to draft from (the text ends inside a character,
        or the draft's context is full)."""
        self._append(st, history)
        if st.pending or not st.text and not st.toks:
            return False
        return self._catch_up(st, seq_id)

    def _catch_up(self, st: _Seq, seq_id: int) -> bool:
        k, toks, ends = tokenize_tail(st.text, st.ends, KEEP_TAIL, st.floor, self._denc, self.pairs)
        st.toks[k:], st.ends[k:] = toks, ends
        if not st.toks:
            return False
        cached = st.cached
        p = common_prefix(cached, st.toks, start=st.floor)   # tokens before the floor never change
        p = min(p, len(st.toks) - 1)     # the last token is decoded again: its logits are needed
        if p < len(cached):
            if not self.ctx.seq_rm(seq_id, p - st.shift, -1):   # a recurrent draft
                p = self._roll_back(st, seq_id, p)
            del cached[p:]
        recurrent = self.draft.needs_checkpoints
        skip = len(st.toks) - p - SYNC_WINDOW
        if skip > 0 and p > 0 and not recurrent:
            # Back from a pause: only the last SYNC_WINDOW tokens are evaluated, right after what
            # the KV holds (as ModelDrafter._sync does); the skipped ones are never re-tokenized.
            cached.extend([GAP] * skip)
            p += skip
            st.shift += skip
            st.floor = p
        if len(cached) - st.shift + len(st.toks) - p >= self.ctx.n_ctx_seq:
            return False
        if recurrent:
            # The next step re-tokenizes from restart_index on: a checkpoint there is where the
            # memory rolls back to, with no token before it evaluated again.
            c = min(restart_index(st.ends, KEEP_TAIL, st.floor), len(st.toks) - 1)
            if c > p:
                self.ctx.decode(st.toks[p:c], p - st.shift, seq_id, outputs=0)
                cached.extend(st.toks[p:c])
                p = c
                st.checkpoint = (c, self.ctx.save_seq(seq_id))
        todo = st.toks[p:]
        self.ctx.decode(todo, p - st.shift, seq_id, outputs="last")
        cached.extend(todo)
        return True

    def _roll_back(self, st: _Seq, seq_id: int, p: int) -> int:
        """model.roll_back on this sequence's checkpoint; starting over drops the checkpoint."""
        if st.checkpoint is not None and st.checkpoint[0] > p:
            st.checkpoint = None
        return roll_back(self.ctx, seq_id, st.checkpoint, p)

    # -- drafting --------------------------------------------------------------------------------
    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        if n_max <= 0 or not history:
            return Draft([])
        st = self._seqs.get(seq_id) or self._new_seq(seq_id)
        if not self._sync(st, seq_id, history):
            return Draft([])
        cached = st.cached
        # One draft token more than asked: the last target token of the drafted text is dropped
        # (it may be the start of a longer word).
        n_draft = min(n_max + 1, self.ctx.n_ctx_seq - (len(cached) - st.shift) - 1)
        drafted: list[int] = []
        ended = False
        while len(drafted) < n_draft:
            row = self.ctx.logits(1)[0]
            if self.p_min > 0.0:
                tok, p = top_probability(row)
                if p < self.p_min:
                    break
            else:
                tok = int(row.argmax())
            drafted.append(tok)
            if self.draft.is_eog(tok):
                ended = True
                break
            if len(drafted) >= n_draft:
                break
            self.ctx.decode([tok], len(cached) - st.shift, seq_id, outputs="last")
            cached.append(tok)
        tokens = self._to_target(history, drafted, ended)
        return Draft(tokens[:n_max], None, self.name)

    def _to_target(self, history: Sequence[int], drafted: list[int], ended: bool) -> list[int]:
        """The drafted draft tokens as target tokens (see translated_text.draft_to_target)."""
        if not drafted:
            return []
        body = b"".join(self._dpiece(t) for t in (drafted[:-1] if ended else drafted))
        text = replace_with_offsets(body[:complete_utf8_len(body)].decode("utf-8", errors="replace"), self.back)[0]
        if ended:   # the draft's end of turn: drafted only when a replacement names it for the target
            eog = self._dpiece(drafted[-1]).decode("utf-8", errors="replace")
            mapped = replace_with_offsets(eog, self.back)[0]
            text += mapped if mapped != eog else ""
        ctx_tokens = [t for t in history[-CONTEXT_TOKENS:] if t != self.target.bos]
        context = b"".join(self._tpiece(t) for t in ctx_tokens)
        return draft_to_target(context, ctx_tokens, text, self._tenc,
                               is_stable=(lambda t: True) if ended else self.target.is_eog)

    def time_token(self) -> float | None:
        """A one-token decode of the draft on its empty memory; None once it holds a sequence."""
        return None if self._seqs else self.ctx.time_one_token(max(0, self.draft.bos))

    def end(self, seq_id: int) -> None:
        """The sequence is over: its tokens and KV stay for the next prompt (`begin`), cut to what
        the memory really holds (a decode cut short by Ctrl-C). A spliced record, or a recurrent
        memory that does not hold what the record says, is dropped."""
        st = self._seqs.get(seq_id)
        if st is None:
            return
        n = self.ctx.seq_pos_max(seq_id) + 1 + st.shift
        if st.shift or (self.draft.needs_checkpoints and n != len(st.cached)):
            self.ctx.seq_rm(seq_id, 0, -1)
            del self._seqs[seq_id]
        elif not self.draft.needs_checkpoints and n < len(st.cached):
            del st.cached[n:]

    def close(self) -> None:
        self.ctx.close()
