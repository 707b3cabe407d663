"""llguidance's engine for one sequence: JSON schemas (compiled by llguidance itself) and plain
GBNF grammars (grammar_lark.py), on an `LLMatcher` over the model's vocabulary.

Same interface as llama.cpp's LlamaGrammarState (grammar_llama.py): `allows`, `allowed_mask`,
`mask`, `allowed_ids`, all read from one bitmask per position (~25 us on 49k tokens for a schema,
0.4-1.3 ms for a GBNF grammar: grammar_lark.py), `accept`, `accept_all`, `clone` (deep_copy,
< 1 us), plus `valid_prefix` (a draft's allowed length, without a clone) and `forced_bytes`
(compute_ff_bytes, for the grammar drafters).

End of generation: every EOG token of the vocabulary is llguidance's EOS, in the mask exactly
where the grammar accepts. The matcher never consumes one (the engine ends the sequence instead).

Compiling is not done here for request input that has not compiled in the worker first
(grammar.py checks that); a matcher once built for a grammar is kept (`_TEMPLATES`) and each
state starts as a deep copy of it, so a batch of requests with one schema compiles it once.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Sequence

import numpy as np

__all__ = ["LLGState", "tokenizer", "limits", "JSON_OPTIONS", "schema_grammar", "lark_grammar", "compile_error"]

# llama.cpp's JSON whitespace (grammar_schema.JSON_SPACE: `space ::= | " " | "\n"{1,2} [ \t]{0,20}`),
# one gap at a time: never unbounded. Given as overrides, so a schema's own "x-guidance" cannot
# loosen it, turn on `lenient` (unknown keywords dropped) or change the separators.
JSON_OPTIONS = {
    "whitespace_flexible": False,
    "whitespace_pattern": r"(?:[ ]|\n{1,2}[ \t]{0,20})?",
    "item_separator": ",",
    "key_separator": ":",
    "lenient": False,
    # oneOf as anyOf where llguidance cannot prove the branches disjoint (llama.cpp's converter
    # reads every oneOf so): refusing would refuse a keyword strict mode accepts
    "coerce_one_of": True,
}


def limits():
    """llguidance's parser limits: its defaults (a schema at every grammar_bounds limit compiles
    under them in ~3 s: 10,000 properties; 4,000 enum values; 32 levels; maxLength 100,000),
    error messages without parser state."""
    from llguidance import LLParserLimits

    return LLParserLimits(max_items_in_row=2000, initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000,
                          step_max_items=50_000, max_lexer_states=250_000, max_grammar_size=500_000,
                          precompute_large_lexemes=True, verbose_errors=False)


def schema_grammar(schema_text: str) -> str:
    """llguidance's grammar (its JSON) for a JSON schema's text, with JSON_OPTIONS."""
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_json_schema(schema_text, overrides=JSON_OPTIONS)


def lark_grammar(lark: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_lark(lark)


def compile_error(grammar: str, tok=None) -> str:
    """'' when llguidance compiles `grammar` (against `tok`, when given), else why not."""
    from llguidance import LLMatcher

    if tok is None:
        failed, why = LLMatcher.validate_grammar_with_warnings(grammar, None, limits=limits())
        return "; ".join(why) if failed else ""
    m = LLMatcher(tok, grammar, limits=limits(), log_level=0)
    if not m.is_error():
        m.compute_bitmask()   # (the first mask builds the lexer: the first token's cost, checked too)
    return m.get_error() if m.is_error() else ""


_TOK_LOCK = threading.Lock()


def tokenizer_of_vocab(vocab, n_vocab: int):
    """llguidance's tokenizer of a llama.cpp vocabulary, every EOG token an end of generation."""
    import warnings

    import llama_cpp
    import llguidance.llamacpp

    eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    with warnings.catch_warnings():   # (it asks llama_token_get_attr, deprecated, once per token)
        warnings.simplefilter("ignore", DeprecationWarning)
        return llguidance.llamacpp.lltokenizer_from_vocab(vocab, eos_token=eog or None)


def tokenizer(model):
    """The model's llguidance tokenizer, made once per loaded model (0.24 s on SmolLM2's 49k
    vocabulary, 0.9 s on Qwen's 151k) and kept on it."""
    tok = getattr(model, "_llg_tokenizer", None)
    if tok is None:
        with _TOK_LOCK:
            tok = getattr(model, "_llg_tokenizer", None)
            if tok is None:
                tok = tokenizer_of_vocab(model.vocab, model.n_vocab)
                model._llg_tokenizer = tok
    return tok


_TEMPLATES: "OrderedDict[tuple, object]" = OrderedDict()   # (model id, grammar) -> a fresh matcher
_TEMPLATE_LOCK = threading.Lock()
MAX_TEMPLATES = 16


def _matcher(model, grammar: str):
    """A fresh matcher for `grammar` (a deep copy of the one kept); ValueError with llguidance's
    reason when it does not compile."""
    from llguidance import LLMatcher

    key = (id(model), grammar)
    with _TEMPLATE_LOCK:
        hit = _TEMPLATES.get(key)
        if hit is not None and hit[0]() is model:   # (a weak reference: a dropped model is not kept)
            _TEMPLATES.move_to_end(key)
            return hit[1].deep_copy()
    m = LLMatcher(tokenizer(model), grammar, limits=limits(), log_level=0)
    if m.is_error():
        raise ValueError(m.get_error())
    with _TEMPLATE_LOCK:
        _TEMPLATES[key] = (weakref.ref(model), m)
        while len(_TEMPLATES) > MAX_TEMPLATES:
            _TEMPLATES.popitem(last=False)
    return m.deep_copy()


class _Family:
    """What the states of one grammar share: the vocabulary size and its EOG ids."""

    def __init__(self, model):
        self.n = model.n_vocab
        self.eog = frozenset(tokenizer(model).eos_tokens)


class LLGState:
    """One sequence's live grammar on llguidance (see the module docstring)."""

    def __init__(self, model, spec, grammar: str, *, _matcher_=None, _family=None):
        self.model, self.spec, self.grammar = model, spec, grammar
        self._m = _matcher_ if _matcher_ is not None else _matcher(model, grammar)
        self._fam = _family or _Family(model)
        self._bits: np.ndarray | None = None   # this position's mask, once computed
        self._ok: np.ndarray | None = None     # ... unpacked

    # ---- asking ----------------------------------------------------------------------------------
    def allows(self, token: int) -> bool:
        """From the mask (one per position, ~25 us for a schema): llguidance's mask is narrower
        than validate_tokens where text is forced (`name` only, not `n` or `na`, after a key's
        quote), and sampling must ask one set everywhere or a draft could change the output."""
        token = int(token)
        if not 0 <= token < self._fam.n:
            return False
        return bool((int(self._bitmask()[token >> 5]) >> (token & 31)) & 1)

    def _bitmask(self) -> np.ndarray:
        """This position's mask, one bit per token id (computed once per position)."""
        if self._bits is None:
            import llguidance.numpy as lnp

            bits = np.empty((1, (self._fam.n + 31) // 32), dtype=np.int32)
            lnp.fill_next_token_bitmask(self._m, bits)
            self._bits = bits[0]
        return self._bits

    def allowed_mask(self, n: int) -> np.ndarray:
        """Booleans over token ids 0..n-1: True where the grammar allows the token now."""
        if self._ok is None:
            self._ok = np.unpackbits(self._bitmask().view(np.uint8), bitorder="little")[:self._fam.n].astype(bool)
        ok = self._ok
        if ok.shape[0] != n:
            out = np.zeros(n, dtype=bool)
            out[:min(n, ok.shape[0])] = ok[:n]
            return out
        return ok

    def mask(self, row: np.ndarray) -> np.ndarray:
        """A copy of `row` with every token the grammar refuses at -inf."""
        out = np.array(row, dtype=np.float32, copy=True)
        out[~self.allowed_mask(row.shape[0])] = -np.inf
        return out

    def allowed_ids(self, candidates: Sequence[int]) -> list[int]:
        """Which of `candidates` the grammar allows now, in their order (from the mask)."""
        if not len(candidates):
            return []
        bits = self._bitmask()
        ids = np.asarray(candidates, dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < self._fam.n)]
        return ids[(bits[ids >> 5] >> (ids & 31)) & 1 != 0].tolist()

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` the grammar's bytes allow in a row from here (an EOG counting where
        the grammar is complete); the state does not move. Byte-level (validate_tokens): it may
        pass a token the mask refuses (a forced word's first letters), which its verify row then
        rejects: a draft cut, never an output changed."""
        tokens = [int(t) for t in tokens]
        n = self._m.validate_tokens(tokens)
        if n < len(tokens) and tokens[n] in self._fam.eog:
            probe = self._m.deep_copy()
            if probe.try_consume_tokens(tokens[:n]) == n and probe.is_accepting():
                n += 1
        return n

    def is_accepting(self) -> bool:
        return self._m.is_accepting()

    def forced_bytes(self) -> bytes:
        """The bytes the grammar forces from here (none where it allows a choice)."""
        return self._m.compute_ff_bytes()

    # ---- moving ----------------------------------------------------------------------------------
    def accept(self, token: int) -> None:
        """Advance by one emitted token; ValueError when the grammar refuses it (the matcher would
        enter its error state for good)."""
        token = int(token)
        # (try_consume_tokens refuses without entering the error state; consume_token would not)
        if token in self._fam.eog or self._m.try_consume_tokens([token]) != 1:
            raise ValueError(f"the grammar refuses token {token} ({self.model.token_text(token)!r})")
        self._bits = self._ok = None

    def accept_all(self, tokens: Sequence[int]) -> int:
        """Accept tokens while the grammar allows them; returns how many were accepted."""
        toks = []
        for t in tokens:
            if int(t) in self._fam.eog:
                break
            toks.append(int(t))
        n = self._m.try_consume_tokens(toks) if toks else 0
        if n:
            self._bits = self._ok = None
        return n

    def rollback(self, n: int) -> None:
        if n > 0:
            self._m.rollback(n)
            self._bits = self._ok = None

    def clone(self) -> "LLGState":
        c = LLGState.__new__(LLGState)
        c.model, c.spec, c.grammar, c._fam = self.model, self.spec, self.grammar, self._fam
        c._m = self._m.deep_copy()
        c._bits, c._ok = self._bits, self._ok   # (the same position: the same mask, read only)
        return c

    def close(self) -> None:
        self._m = None
