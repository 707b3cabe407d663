"""How many prompt tokens of a request being admitted ride in one shared step (chunked prefill).

While a long prompt is evaluated, the sequences already generating wait for it unless it is cut
into chunks that share their steps. A step with an n-token chunk costs about `a + b * n`: `b` per
prompt token, `a` a fixed part (the weights read once more, thread wake-ups at every operation:
measured on SmolLM2 F16, 2 threads, a passive OpenMP wait, a = 0.13 s against 0.018 s for a
one-token step, b = 4.4 ms). Both are fitted as the server runs (a least-squares line through the
recent chunk steps, older ones weighing less). Small chunks keep a stream fluid but make the prompt
pay `a` many times over (there: chunks of 16 tokens evaluated 2,000 tokens in 20.4 s, of 128 in
10.8 s, of 511 in 10.5 s), so a chunk gets n = a / (OVERHEAD * b) tokens: the fixed part is
OVERHEAD of the chunk's own cost, the prompt waits about that much longer than in one piece, and
a running stream pauses about a * (1 + 1 / OVERHEAD) per step (5 a), and never for much more than
PAUSE_CAP: where a step's fixed part is large (a loaded machine) the stream's pace comes first.
With no sequence generating nobody waits: the chunk is the whole batch; with none streaming
nobody sees a pause: the chunk is all the room the batch has left.

    >>> b = PrefillBudget(n_batch=512)
    >>> b.tokens(generating=0, reserved=0), b.tokens(generating=1, reserved=17)
    (512, 64)
    >>> b.observe(0.13 + 64 * 0.0044, 64, generating=1)
    >>> b.tokens(generating=1, reserved=17)      # one size seen: try another to fit the line
    128
    >>> b.observe(0.13 + 128 * 0.0044, 128, generating=1)
    >>> b.tokens(generating=1, reserved=17)      # 0.13 / (0.25 * 0.0044)
    118
    >>> b = PrefillBudget(n_batch=512)           # a loaded machine: a = 0.4 s
    >>> b.observe(0.4 + 100 * 0.0044, 100, generating=1); b.observe(0.4 + 200 * 0.0044, 200, generating=1)
    >>> b.tokens(generating=1, reserved=17)      # (1.0 - a) / b, not a / (0.25 b) = 363
    136
    >>> b.tokens(generating=4, reserved=508)     # drafts give way to a minimum chunk
    16
    >>> b.tokens(generating=1, reserved=17, streaming=False)   # no stream to keep fluid: all the room
    495
"""

from __future__ import annotations

OVERHEAD = 0.25     # a chunk's fixed cost, as a share of its per-token cost
PAUSE_CAP = 1.0     # seconds: the longest step a chunk may make for a running stream
FIRST_CHUNK = 64    # before the costs are measured
MIN_CHUNK = 16      # a slow step still lets a prompt advance
DECAY = 0.7         # weight of a step in the fit, per newer step


class PrefillBudget:
    def __init__(self, n_batch: int):
        self.n_batch = n_batch
        # decayed sums over the steps with a prompt chunk: weight, n, t, n^2, n*t
        self._w = self._n = self._t = self._nn = self._nt = 0.0
        self._last = 0
        self._fit: tuple[float, float] | None = None   # the last line that could be fitted

    def tokens(self, generating: int, reserved: int, streaming: bool = True) -> int:
        """Prompt tokens for the next step, beside `generating` sequences whose last token and
        drafts may use `reserved` rows of the batch (each keeps one row at least). streaming:
        one of them streams its text; if none does, a pause is seen by nobody (a client waiting
        for a whole answer sees its latency, which small chunks lengthen by their fixed parts):
        the prompt takes all the room, as llama-server's does."""
        if not generating:
            return self.n_batch
        room = max(self.n_batch - reserved, min(MIN_CHUNK, self.n_batch - generating))
        if not streaming:
            return room
        fit = self._fit = self.fit() or self._fit
        if fit is None:   # nothing measured yet, or one chunk size only: no line through it
            n = 2 * self._last if self._last else FIRST_CHUNK
        else:
            a, b = fit
            n = max(MIN_CHUNK, min(round(a / (OVERHEAD * b)), int((PAUSE_CAP - a) / b)))
        return min(room, n)

    def fit(self) -> tuple[float, float] | None:
        """(a, b) of the step time a + b * n, or None while it cannot be told."""
        w = self._w
        if not w:
            return None
        var = self._nn / w - (self._n / w) ** 2
        if var <= (0.05 * self._n / w) ** 2:   # recent chunk sizes within ~5% of each other
            return None
        b = (self._nt / w - self._n / w * self._t / w) / var
        if b <= 0:
            return None
        a = max(self._t / w - b * self._n / w, 0.0)
        return a, b

    def observe(self, seconds: float, n_prompt: int, generating: int) -> None:
        """A step took `seconds`, with `n_prompt` prompt tokens in it."""
        if n_prompt == 0:
            return
        self._last = n_prompt
        self._w = DECAY * self._w + 1
        self._n = DECAY * self._n + n_prompt
        self._t = DECAY * self._t + seconds
        self._nn = DECAY * self._nn + n_prompt * n_prompt
        self._nt = DECAY * self._nt + n_prompt * seconds
