"""serve's -c and --kv-unified-per-slot as llama-server reads them (tools/server/server.cpp and
server-context.cpp's n_ctx_slot): -c is the context of the whole KV cache, shared by the slots,
each slot holding n_ctx / n_parallel tokens (llama.cpp rounds both up to a multiple of 256);
--kv-unified-per-slot N caps each slot at N and, without -c, sizes the cache to n_parallel * N.
The Generator takes a context per sequence, so this turns the flags into that.
"""

from __future__ import annotations

from dataclasses import dataclass

PAD = 256   # llama.cpp's GGML_PAD(n_ctx, 256), for the whole context and for each sequence's


def _pad(n: int) -> int:
    return -(-n // PAD) * PAD


@dataclass(frozen=True)
class SlotContext:
    per_slot: int | None   # the Generator's ctx_size (None: its default, 4096 capped at the model's training context)
    warning: str | None = None


def slot_context(ctx_size: int | None, per_slot: int | None, parallel: int, train: int | None = None) -> SlotContext:
    """The context per slot for `-c ctx_size` (None: not given; 0: the model's training context
    `train`, shared) and `--kv-unified-per-slot per_slot` with `parallel` slots, as llama-server
    sizes them.

        >>> slot_context(8192, None, 4).per_slot          # -np 4 -c 8192: 2048 each
        2048
        >>> slot_context(8192, None, 3).per_slot          # 8192 / 3 = 2730, padded as llama.cpp pads
        2816
        >>> slot_context(None, 1024, 4).per_slot          # the cache sized to 4 x 1024
        1024
        >>> slot_context(8192, 1024, 4).per_slot          # the cap binds
        1024
        >>> s = slot_context(4096, 2048, 4); s.per_slot   # the cap is above the share: no effect
        1024
        >>> slot_context(0, None, 4, train=8192).per_slot
        2048
        >>> slot_context(None, None, 4).per_slot is None
        True
    """
    if ctx_size is None:
        return SlotContext(per_slot)
    total = train if ctx_size == 0 and train else ctx_size
    if not total:   # -c 0 with an unknown training context: the Generator's own rule (training, per slot)
        return SlotContext(0 if per_slot is None else per_slot)
    share = _pad(_pad(total) // max(1, parallel))
    if per_slot is None or per_slot == share:
        return SlotContext(share)
    if per_slot < share:
        return SlotContext(per_slot)
    return SlotContext(share, f"--kv-unified-per-slot {per_slot} exceeds what -c {ctx_size} leaves each of "
                              f"{parallel} slots ({share} tokens): it has no effect (raise -c, or leave -c out "
                              f"to size the context to {parallel} x {per_slot})")


def describe(n_ctx_slot: int, parallel: int) -> str:
    """The start-up line's words for the context.

        >>> describe(2048, 4)
        'context 8192 tokens shared by 4 slots: 2048 per slot'
        >>> describe(4096, 1)
        'context 4096 tokens'
    """
    if parallel == 1:
        return f"context {n_ctx_slot} tokens"
    return f"context {n_ctx_slot * parallel} tokens shared by {parallel} slots: {n_ctx_slot} per slot"
