"""How many prompt tokens of a request being admitted ride in one shared step (chunked prefill).

While a long prompt is evaluated, the sequences already generating wait for it unless it is cut
into chunks that share their steps. A step costs about `base + per_token * n`: `base` the step of
the sequences generating (drafting, their verify rows, sampling, streaming), `per_token` one more
prompt token. Both are measured as the server runs (moving averages of the steps with and without
a chunk). A chunk gets n = (STRETCH - 1) * base / per_token tokens, so a step with a chunk takes
about STRETCH times one without: a stream keeps at least 1/STRETCH of its pace while a long prompt
arrives, and the prompt pays about one `base` per chunk (about 1/STRETCH of its own time) for the
company. With no sequence generating nobody waits: the chunk is the whole batch.

    >>> b = PrefillBudget(n_batch=512)
    >>> b.tokens(generating=0, reserved=0), b.tokens(generating=1, reserved=17)
    (512, 64)
    >>> b.observe(0.020, 0, generating=1); b.observe(0.020 + 64 * 0.001, 64, generating=1)
    >>> b.tokens(generating=1, reserved=17)   # (8 - 1) * 20 ms / 1 ms
    140
    >>> b.tokens(generating=4, reserved=508)  # drafts give way to a minimum chunk
    16
"""

from __future__ import annotations

STRETCH = 8         # a step with a prompt chunk may take this many times one without
FIRST_CHUNK = 64    # before the costs are measured
MIN_CHUNK = 16      # a slow step still lets a prompt advance
ALPHA = 0.3         # weight of the newest step in the moving averages


class PrefillBudget:
    def __init__(self, n_batch: int):
        self.n_batch = n_batch
        self.base: float | None = None        # seconds of a step without a prompt chunk
        self.per_token: float | None = None   # seconds per prompt token in a step

    def tokens(self, generating: int, reserved: int) -> int:
        """Prompt tokens for the next step, beside `generating` sequences whose last token and
        drafts may use `reserved` rows of the batch (each keeps one row at least)."""
        if not generating:
            return self.n_batch
        room = max(self.n_batch - reserved, min(MIN_CHUNK, self.n_batch - generating))
        if self.base is None or self.per_token is None:
            n = FIRST_CHUNK
        else:
            n = max(MIN_CHUNK, int((STRETCH - 1) * self.base / self.per_token))
        return min(room, n)

    def observe(self, seconds: float, n_prompt: int, generating: int) -> None:
        """A step took `seconds`, with `n_prompt` prompt tokens in it."""
        if n_prompt == 0:
            if generating:
                self.base = _average(self.base, seconds)
            return
        extra = seconds - (self.base or 0.0) if generating else seconds
        self.per_token = _average(self.per_token, max(extra, 0.0) / n_prompt or 1e-6)


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)
