"""The server's counters as Prometheus text (`GET /metrics`): llama-server's names under a
`llamaspec:` prefix, plus the speculative ones (drafted and accepted tokens, in total and per
drafter) and cancelled requests. Updated by the engine thread, read by the HTTP side.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from llamaspec.api.generator import Result

PREFIX = "llamaspec:"


class Metrics:
    def __init__(self, gauges: Callable[[], dict[str, int]] | None = None):
        # gauges(): {"requests_processing": n, "requests_deferred": n, "requests_in_flight": n}, read at each scrape
        self.gauges = gauges or (lambda: {})
        self._lock = threading.Lock()
        self.prompt_tokens = 0          # prompt tokens evaluated (those reused from a slot's KV cache apart)
        self.prompt_seconds = 0.0
        self.cached_tokens = 0
        self.predicted_tokens = 0
        self.predicted_seconds = 0.0
        self.requests = 0
        self.cancelled_requests = 0
        self.drafted = 0
        self.accepted = 0
        self.per_drafter: dict[str, list[int]] = {}   # name -> [drafted, accepted]

    def finished(self, result: "Result", cache_n: int) -> None:
        s = result.stats
        with self._lock:
            self.requests += 1
            self.prompt_tokens += max(0, result.n_prompt - cache_n)
            self.cached_tokens += cache_n
            self.prompt_seconds += s.get("prompt_seconds", 0.0)
            self.predicted_tokens += len(result.tokens)
            self.predicted_seconds += s.get("gen_seconds", 0.0)
            self.drafted += s.get("drafted", 0)
            self.accepted += s.get("accepted", 0)
            for name, d in (s.get("per_drafter") or {}).items():
                c = self.per_drafter.setdefault(name, [0, 0])
                c[0] += d.get("drafted", 0)
                c[1] += d.get("accepted", 0)

    def cancelled(self) -> None:
        with self._lock:
            self.cancelled_requests += 1

    def render(self) -> str:
        """Prometheus' text exposition format (version 0.0.4)."""
        lines: list[str] = []

        def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {PREFIX}{name} {help}")
            lines.append(f"# TYPE {PREFIX}{name} {kind}")
            lines.extend(f"{PREFIX}{name}{labels} {_num(v)}" for labels, v in samples)

        with self._lock:
            drafters = sorted(self.per_drafter.items())
            metric("prompt_tokens_total", "counter", "Number of prompt tokens processed.", [("", self.prompt_tokens)])
            metric("prompt_seconds_total", "counter", "Prompt process time.", [("", self.prompt_seconds)])
            metric("prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's KV cache.",
                   [("", self.cached_tokens)])
            metric("tokens_predicted_total", "counter", "Number of generation tokens processed.",
                   [("", self.predicted_tokens)])
            metric("tokens_predicted_seconds_total", "counter", "Predict process time.",
                   [("", self.predicted_seconds)])
            metric("requests_total", "counter", "Requests finished.", [("", self.requests)])
            metric("requests_cancelled_total", "counter", "Requests stopped because their client went away.",
                   [("", self.cancelled_requests)])
            metric("draft_tokens_total", "counter", "Draft tokens proposed and verified.", [("", self.drafted)])
            metric("draft_tokens_accepted_total", "counter", "Draft tokens accepted by the target.",
                   [("", self.accepted)])
            metric("drafter_draft_tokens_total", "counter", "Draft tokens proposed, per drafter.",
                   [(f'{{drafter="{_label(n)}"}}', c[0]) for n, c in drafters])
            metric("drafter_draft_tokens_accepted_total", "counter", "Draft tokens accepted, per drafter.",
                   [(f'{{drafter="{_label(n)}"}}', c[1]) for n, c in drafters])
            tps = self.predicted_tokens / self.predicted_seconds if self.predicted_seconds > 0 else 0.0
            pps = self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0
            acc = self.accepted / self.drafted if self.drafted else 0.0
        metric("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", [("", pps)])
        metric("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", [("", tps)])
        metric("draft_acceptance", "gauge", "Accepted / drafted tokens.", [("", acc)])
        g = self.gauges()
        metric("requests_processing", "gauge", "Number of requests processing.",
               [("", g.get("requests_processing", 0))])
        metric("requests_deferred", "gauge", "Number of requests deferred.", [("", g.get("requests_deferred", 0))])
        metric("requests_in_flight", "gauge", "Requests received and not answered yet (queued or processing).",
               [("", g.get("requests_in_flight", 0))])
        return "\n".join(lines) + "\n"


def _num(v: float) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))


def _label(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
