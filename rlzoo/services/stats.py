"""What a service verifier counts: requests, cache hits, retries, failures and latency, as step metrics."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from rlzoo.util.reductions import Max, Mean, Sum


class ServiceStats:
    """Thread-safe counters, taken (and cleared) once per scoring by :meth:`take`.

    A *request* is one logical call (its retries are counted apart, under ``retries``); its latency runs from the
    moment it gets a slot under the concurrency limit to its reply or final failure, retries and backoff included.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self.requests = self.cache_hits = self.retries = self.failures = 0
        self.latencies: list[float] = []
        self.sums: dict[str, float] = {}  # a verifier's own counts (a judge's tokens), by metric name

    def add(self, name: str, value: float) -> None:
        """Add ``value`` to the verifier's own count ``name`` (reported as ``<prefix>/<name>``, a ``Sum``)."""
        with self._lock:
            self.sums[name] = self.sums.get(name, 0.0) + value

    def count(self, *, requests: int = 0, cache_hits: int = 0, retries: int = 0, failures: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.cache_hits += cache_hits
            self.retries += retries
            self.failures += failures

    def latency(self, seconds: float) -> None:
        with self._lock:
            self.latencies.append(seconds)

    def take(self, prefix: str) -> dict[str, float]:
        """``<prefix>/requests``, ``cache_hits``, ``retries``, ``failures`` (counts, ``Sum`` over the step's
        scorings) and, when a request was made, ``latency_p50_s`` (a ``Mean`` over the scorings) and
        ``latency_p95_s`` (a ``Max``): nearest-rank percentiles of this scoring's request latencies; and each count
        :meth:`add` made. Cleared after."""
        with self._lock:
            metrics: dict[str, float] = {
                f"{prefix}/requests": Sum(self.requests),
                f"{prefix}/cache_hits": Sum(self.cache_hits),
                f"{prefix}/retries": Sum(self.retries),
                f"{prefix}/failures": Sum(self.failures),
            }
            metrics.update({f"{prefix}/{name}": Sum(value) for name, value in self.sums.items()})
            if self.latencies:
                metrics[f"{prefix}/latency_p50_s"] = Mean(percentile(self.latencies, 50))
                metrics[f"{prefix}/latency_p95_s"] = Max(percentile(self.latencies, 95))
            self._clear()
            return metrics


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile: the smallest value with at least ``q`` % of ``values`` at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least the first
    return ordered[int(rank) - 1]


def service_prefixes(keys: Iterable[str]) -> list[str]:
    """The prefixes of service counters among metric keys, sorted: each ``P`` with both ``P/requests`` and
    ``P/cache_hits`` there (what :meth:`ServiceStats.take` always writes)."""
    keys = set(keys)
    return sorted(
        key.removesuffix("/requests")
        for key in keys
        if key.endswith("/requests") and key.removesuffix("/requests") + "/cache_hits" in keys
    )


def service_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The service counters among ``metrics`` (a verifier's phase metrics): every ``P/*`` key of a
    :func:`service_prefixes` prefix ``P``."""
    prefixes = set(service_prefixes(metrics))
    return {key: value for key, value in metrics.items() if key.rpartition("/")[0] in prefixes}
