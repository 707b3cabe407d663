"""Can DRAFT draft for TARGET? llama.cpp's vocabulary rules, from GGUF headers alone.

The rules are those of `common_speculative_are_compatible` (llama.cpp common/speculative.cpp):
  vocab_type   same llama_vocab_type (SPM, BPE, ...)
  bos          same add_bos flag; when BOS is added, the same BOS id
  eos          same add_eos flag; when EOS is added, the same EOS id
  vocab_size   |n_vocab(target) - n_vocab(draft)| <= 128
  token_text   equal text (strcmp) for every id from 5 to min(n_vocab) - 1
llama.cpp stops at the first failed rule and only says "vocab type must match"; here every rule
is evaluated and reported, with the first differing token and both texts. Softer facts (same
architecture family, size ratio, chat template) are reported too but never decide the verdict.

Two kinds of pair can draft (Verdict.kind):
  token-exact   every rule passes: the draft's token ids are the target's (the fast path)
  translated    an ordinary model (draft-simple) whose vocabulary fails a rule, while both sides
                have a tokenizer: drafts go through text (speculative/drafters/translated.py),
                at the cost of re-tokenizing a short tail of the text each step
and `incompatible` is left for a pair that cannot draft at all (a draft made for another target,
or a side without a vocabulary).

A draft made for one target (EAGLE-3, DFlash, DSpark, Gemma 4 assistant: gguf/drafts.py) must
also fit that target's shape, checked after the vocabulary rules (draft_fit_rules):
  target_arch    the assistant drafts for gemma4 only (it reads the target's embeddings and KV)
  hidden_size    the target's hidden size is the one the draft was trained on
  target_layers  the target has every layer the draft reads (llama.cpp aborts on a layer id
                 past the target's n_layer); EAGLE-3 reads exactly 3
  kv_layout      the assistant attends on the target's last full-attention layer and the
                 sliding-window layer before it, with the same head sizes
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamaspec.gguf.drafts import DraftInfo, draft_info, fit_checks
from llamaspec.gguf.header import GGUFHeader, read_file
from llamaspec.gguf.vocab import VocabInfo, vocab_from_header

MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_START_TOKEN_ID = 5   # SPEC_VOCAB_CHECK_START_TOKEN_ID

RULES = ("vocab_type", "bos", "eos", "vocab_size", "token_text")  # llama.cpp's order
KINDS = ("token-exact", "translated", "incompatible")

RULE_TITLES = {
    "vocab_type": "vocabulary type",
    "bos": "BOS token",
    "eos": "EOS token",
    "vocab_size": "vocabulary size",
    "token_text": "token texts",
    "target_arch": "target architecture",
    "hidden_size": "hidden size",
    "target_layers": "target layers",
    "kv_layout": "shared KV layers",
}


@dataclass(frozen=True)
class TokenDiff:
    """The first token id (>= 5) whose text differs, with both texts."""

    id: int
    target_text: str
    draft_text: str

    def to_dict(self) -> dict:
        return {"id": self.id, "target_text": self.target_text, "draft_text": self.draft_text}


@dataclass(frozen=True)
class RuleResult:
    rule: str            # one of RULES
    passed: bool
    target: Any          # the value compared on the target side
    draft: Any
    detail: str          # one line for humans

    @property
    def title(self) -> str:
        return RULE_TITLES[self.rule]

    def to_dict(self) -> dict:
        return {"rule": self.rule, "passed": self.passed, "target": self.target, "draft": self.draft,
                "detail": self.detail}


@dataclass(frozen=True)
class Verdict:
    rules: tuple[RuleResult, ...]
    first_diff: TokenDiff | None = None
    facts: dict[str, Any] = field(default_factory=dict)       # softer facts, never decisive
    target: dict[str, Any] = field(default_factory=dict)      # short description of each side
    draft: dict[str, Any] = field(default_factory=dict)
    draft_kind: str = "draft-simple"   # llama.cpp's spec type the draft file drafts as

    @property
    def compatible(self) -> bool:
        return all(r.passed for r in self.rules)

    @property
    def failed(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.rules if not r.passed)

    @property
    def failed_rule(self) -> str | None:
        """The rule llama.cpp would stop at (the first failed one in its order)."""
        return self.failed[0].rule if self.failed else None

    def rule(self, name: str) -> RuleResult:
        return next(r for r in self.rules if r.rule == name)

    @property
    def kind(self) -> str:
        """token-exact (llama.cpp's rules pass), translated (an ordinary model with another
        vocabulary: drafts through text) or incompatible (cannot draft at all)."""
        if self.compatible:
            return "token-exact"
        sides = (self.target.get("vocab_type"), self.draft.get("vocab_type"))
        if self.draft_kind == "draft-simple" and all(t not in (None, "NONE") for t in sides):
            return "translated"
        return "incompatible"

    @property
    def can_draft(self) -> bool:
        return self.kind != "incompatible"

    @property
    def reason(self) -> str:
        """One line: why the pair is (in)compatible."""
        if self.compatible:
            if self.draft_kind != "draft-simple":
                return f"compatible: same vocabulary, and the {self.draft_kind} draft fits this target"
            return "compatible: same vocabulary by llama.cpp's rules"
        first = self.failed[0]
        more = len(self.failed) - 1
        tail = f" (and {more} more rule{'s' if more > 1 else ''} failed)" if more else ""
        why = f"{first.title} differs: {first.detail}{tail}"
        if self.kind == "translated":
            return f"translated: {why}; drafts go through text (re-tokenized each step)"
        return why

    @property
    def warnings(self) -> list[str]:
        return list(self.facts.get("warnings", []))

    def to_dict(self) -> dict:
        return {
            "compatible": self.compatible,
            "kind": self.kind,
            "failed_rule": self.failed_rule,
            "reason": self.reason,
            "rules": [r.to_dict() for r in self.rules],
            "first_diff": self.first_diff.to_dict() if self.first_diff else None,
            "facts": self.facts,
            "target": self.target,
            "draft": self.draft,
            "draft_kind": self.draft_kind,
        }


# ---- the rules ---------------------------------------------------------------------------------


def _c_text(text: str) -> str:
    """What strcmp sees: the text up to its first NUL byte."""
    cut = text.find("\x00")
    return text if cut < 0 else text[:cut]


def first_token_diff(target: VocabInfo, draft: VocabInfo) -> TokenDiff | None:
    """First id in [5, min(n_vocab)) whose texts differ as strcmp sees them, or None."""
    a, b = target.tokens, draft.tokens
    n = min(len(a), len(b))
    start = CHECK_START_TOKEN_ID
    if n <= start or a[start:n] == b[start:n]:  # C-speed fast path: the usual, equal case
        return None
    for i in range(start, n):
        if a[i] != b[i] and _c_text(a[i]) != _c_text(b[i]):
            return TokenDiff(i, a[i], b[i])
    return None  # they differed only after an embedded NUL: strcmp calls them equal


def _special_rule(rule: str, name: str, t_add: bool, d_add: bool, t_id: int | None, d_id: int | None,
                  t: VocabInfo, d: VocabInfo) -> RuleResult:
    def side(add: bool, tid: int | None, v: VocabInfo) -> dict:
        return {"add": add, "id": tid, "text": v.token_text(tid)}

    ts, ds = side(t_add, t_id, t), side(d_add, d_id, d)
    if t_add != d_add:
        return RuleResult(rule, False, ts, ds,
                          f"add_{name.lower()} is {str(t_add).lower()} in the target, {str(d_add).lower()} in the draft")
    if t_add and t_id != d_id:
        return RuleResult(rule, False, ts, ds,
                          f"{name} is added but its id differs: target {_id(t_id)} {t.token_text(t_id)!r}, "
                          f"draft {_id(d_id)} {d.token_text(d_id)!r}")
    if t_add:
        return RuleResult(rule, True, ts, ds, f"both add {name} id {_id(t_id)}")
    return RuleResult(rule, True, ts, ds, f"neither adds {name} (ids not compared)")


def _id(token_id: int | None) -> str:
    return "none" if token_id is None else str(token_id)


def compare_vocabs(target: VocabInfo, draft: VocabInfo) -> tuple[tuple[RuleResult, ...], TokenDiff | None]:
    """Evaluate every rule of llama.cpp's check; llama.cpp's verdict is `all(passed)`."""
    rules: list[RuleResult] = []
    same_type = target.vocab_type == draft.vocab_type
    rules.append(RuleResult("vocab_type", same_type, target.vocab_type, draft.vocab_type,
                            f"both {target.vocab_type}" if same_type
                            else f"target is {target.vocab_type} ({target.model}), draft is {draft.vocab_type} ({draft.model})"))
    rules.append(_special_rule("bos", "BOS", target.add_bos, draft.add_bos, target.bos_id, draft.bos_id, target, draft))
    rules.append(_special_rule("eos", "EOS", target.add_eos, draft.add_eos, target.eos_id, draft.eos_id, target, draft))
    diff = abs(target.n_vocab - draft.n_vocab)
    ok = diff <= MAX_SIZE_DIFFERENCE
    rules.append(RuleResult("vocab_size", ok, target.n_vocab, draft.n_vocab,
                            f"{target.n_vocab} vs {draft.n_vocab} tokens: difference {diff} "
                            f"{'<=' if ok else '>'} {MAX_SIZE_DIFFERENCE}"))
    first = first_token_diff(target, draft)
    n = min(target.n_vocab, draft.n_vocab)
    if first is None:
        detail = (f"ids {CHECK_START_TOKEN_ID}..{n - 1} all equal" if n > CHECK_START_TOKEN_ID
                  else "nothing to compare")
    else:
        detail = f"token {first.id}: target {first.target_text!r}, draft {first.draft_text!r}"
    rules.append(RuleResult("token_text", first is None, None if first is None else first.target_text,
                            None if first is None else first.draft_text, detail))
    return tuple(rules), first


# ---- drafts made for a target ------------------------------------------------------------------


def draft_fit_rules(target: GGUFHeader, draft: GGUFHeader, info: DraftInfo) -> tuple[RuleResult, ...]:
    """The shape rules for a draft made for a target (see the module docstring; gguf/drafts.py
    holds the checks, shared with the drafters that load such files)."""
    return tuple(RuleResult(*check) for check in fit_checks(target, draft, info))


# ---- softer facts ------------------------------------------------------------------------------


_FAMILY_ALIASES = {"qwen3next": "qwen3", "qwen35moe": "qwen35", "gemma4-assistant": "gemma4", "glm4moe": "glm4",
                   "granitemoe": "granite", "granitehybrid": "granite", "llama-embed": "llama"}


def arch_family(arch: str) -> str:
    """Architecture family: qwen3moe -> qwen3, granitemoe -> granite (a soft fact only)."""
    a = arch.lower()
    if a in _FAMILY_ALIASES:
        return _FAMILY_ALIASES[a]
    changed = True
    while changed:
        changed = False
        for suffix in ("moe", "vl"):
            if a.endswith(suffix) and len(a) > len(suffix):
                a, changed = a[: -len(suffix)].rstrip("-_"), True
    return _FAMILY_ALIASES.get(a, a)


def describe(header: GGUFHeader, vocab: VocabInfo) -> dict[str, Any]:
    info = draft_info(header)
    return {
        "draft_info": info.to_dict() if info else None,
        "source": header.source,
        "architecture": header.architecture,
        "name": header.name,
        "file_type": header.file_type,
        "file_size": header.file_size,
        "n_params": header.n_params,
        "n_vocab": vocab.n_vocab,
        "vocab_type": vocab.vocab_type,
        "pre": vocab.pre,
        "fingerprint": vocab.fingerprint,
        "nextn_predict_layers": header.nextn_predict_layers,
    }


def soft_facts(target: GGUFHeader, draft: GGUFHeader) -> dict[str, Any]:
    t_fam, d_fam = arch_family(target.architecture), arch_family(draft.architecture)
    facts: dict[str, Any] = {
        "same_architecture": target.architecture == draft.architecture,
        "same_family": t_fam == d_fam,
        "target_family": t_fam,
        "draft_family": d_fam,
        "chat_template_equal": (target.chat_template or None) == (draft.chat_template or None),
        "size_ratio": None,
        "params_ratio": None,
    }
    if target.file_size and draft.file_size:
        facts["size_ratio"] = round(draft.file_size / target.file_size, 4)  # draft / target
    if target.n_params and draft.n_params:
        facts["params_ratio"] = round(draft.n_params / target.n_params, 4)
    warnings = []
    if not facts["same_family"] and draft_info(draft) is None:  # a made-for-target draft has its own arch
        warnings.append(f"different architecture families ({target.architecture} vs {draft.architecture}): "
                        "expect low acceptance")
    if facts["size_ratio"] is not None and facts["size_ratio"] >= 1:
        warnings.append("the draft file is not smaller than the target: no speed-up to expect")
    if not facts["chat_template_equal"]:
        warnings.append("chat templates differ (harmless for drafting: the target's template is used)")
    facts["warnings"] = warnings
    return facts


# ---- entry points ------------------------------------------------------------------------------


def check_headers(target: GGUFHeader, draft: GGUFHeader, *, target_vocab: VocabInfo | None = None,
                  draft_vocab: VocabInfo | None = None) -> Verdict:
    """The verdict for two parsed headers (pass already-resolved vocabularies to save time)."""
    tv = target_vocab or vocab_from_header(target)
    dv = draft_vocab or vocab_from_header(draft)
    rules, first = compare_vocabs(tv, dv)
    info = draft_info(draft)
    if info is not None:
        rules = rules + draft_fit_rules(target, draft, info)
    return Verdict(rules, first, soft_facts(target, draft), describe(target, tv), describe(draft, dv),
                   info.kind if info else "draft-simple")


def check_files(target_path, draft_path) -> Verdict:
    """The verdict for two local GGUF files (headers only; model references: pairing/check.check_refs)."""
    return check_headers(read_file(target_path), read_file(draft_path))
