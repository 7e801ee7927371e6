"""A verifier that scores by calling a service: the cache, the client, the counters and the start-up checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import httpx

from rlzoo.interfaces import Problem, RunFacts, Sample, Verdict, Verifier
from rlzoo.services.cache import ResponseCache, cache_key
from rlzoo.services.client import ServiceClient, ServiceError
from rlzoo.services.params import ServiceParams
from rlzoo.services.stats import ServiceStats

CACHE_FILE = "service_cache.sqlite"
PROBE_TIMEOUT_S = 10.0  # the start-up check waits at most this long for the endpoint, whatever timeout_s says


class ServiceVerifier(Verifier):
    """A verifier whose scores come from a service, called under :class:`ServiceParams`' policy.

    A subclass says where it calls (:meth:`probe_url`, :meth:`cache_identity`), how it asks
    (:meth:`score_uncached`: one JSON-able result, or a :class:`ServiceError`, per response) and how a result
    becomes a :class:`Verdict` (:meth:`verdict`, which raises :class:`ServiceError` for a result it cannot use).
    This class does the rest: ``verify_batch`` serves what the cache holds (keyed by the verifier's name,
    :meth:`cache_identity`, prompt, response, answer and the sample's metadata), asks for the rest, keeps each
    usable result, and puts a :class:`ServiceError` in the place of each response it could not score, which
    :func:`rlzoo.rl.scoring.score` counts in ``verifier/errors`` (reward 0, never a silent score). Its counters
    join the step's metrics as ``<metric_prefix>/*`` (:meth:`ServiceStats.take`).
    """

    metric_prefix: ClassVar[str] = "service"
    #: the parameter naming the endpoint, for the start-up check's message
    endpoint_field: ClassVar[str] = "url"
    Params = ServiceParams

    def __init__(self, params: ServiceParams | None = None) -> None:
        super().__init__(params)
        self.stats = ServiceStats()
        self.cache: ResponseCache | None = None
        self._client: ServiceClient | None = None

    # -- what a subclass says ----------------------------------------------------------------------------------

    def probe_url(self) -> str:
        """The URL the start-up check asks (any HTTP answer counts: the service is up)."""
        raise NotImplementedError

    def cache_identity(self) -> tuple[Any, ...]:
        """What, beside the response, decides a score: the endpoint, the model, the rubric."""
        raise NotImplementedError

    def score_uncached(self, samples: list[Sample], responses: list[str]) -> list[Any]:
        """One JSON-able result per response, or a :class:`ServiceError` in its place; use :attr:`client`."""
        raise NotImplementedError

    def verdict(self, result: Any) -> Verdict:
        """The verdict a result means; :class:`ServiceError` if it means none (a reward out of range, ...)."""
        raise NotImplementedError

    # -- the policy --------------------------------------------------------------------------------------------

    @property
    def client(self) -> ServiceClient:
        if self._client is None:
            self._client = ServiceClient(self.params, self.stats, self.headers())
        return self._client

    def headers(self) -> dict[str, str]:
        name = self.params.api_key_env
        if name is None:
            return {}
        key = os.environ.get(name)
        if not key:
            raise ServiceError(f"the environment variable {name} (api_key_env) is not set: it must hold the key")
        return {"Authorization": f"Bearer {key}"}

    def use_run_folder(self, run_dir: Path) -> None:
        if self.params.cache and self.cache is None:
            self.cache = ResponseCache(Path(run_dir) / CACHE_FILE)

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """The key's variable is set, and the endpoint answers."""
        problems = list(super().preflight(run, at))
        name = self.params.api_key_env
        if name is not None and not os.environ.get(name):
            problems.append(
                (f"{at}.api_key_env", f"the environment variable {name} is not set: export it with the key")
            )
        trouble = endpoint_problem(self.probe_url(), min(self.params.timeout_s, PROBE_TIMEOUT_S))
        if trouble:
            problems.append((f"{at}.{self.endpoint_field}", trouble))
        return problems

    def verify(self, sample: Sample, response: str) -> Verdict:
        outcome = self.verify_batch([sample], [response])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def verify_batch(self, samples: list[Sample], responses: list[str]) -> list[Verdict | Exception]:
        identity = self.cache_identity()
        keys = [
            cache_key(self.name, *identity, s.prompt, r, s.answer, s.meta)
            for s, r in zip(samples, responses, strict=True)
        ]
        cached = self.cache.get_many(keys) if self.cache is not None else {}
        todo = [i for i, key in enumerate(keys) if key not in cached]
        self.stats.count(cache_hits=len(keys) - len(todo))
        outcomes: list[Verdict | Exception] = [self.verdict(cached[key]) if key in cached else None for key in keys]
        results = self.score_uncached([samples[i] for i in todo], [responses[i] for i in todo]) if todo else []
        fresh = {}
        for index, result in zip(todo, results, strict=True):
            if isinstance(result, Exception):  # the client counted it already
                outcomes[index] = result
                continue
            try:
                outcomes[index] = self.verdict(result)
                fresh[keys[index]] = result
            except ServiceError as exc:  # a reply that came but means no score
                self.stats.count(failures=1)
                outcomes[index] = exc
        if self.cache is not None:
            self.cache.put_many(fresh)
        return outcomes

    def take_phase_metrics(self) -> dict[str, float]:
        for key, value in self.stats.take(self.metric_prefix).items():
            self.record_phase(key, value)
        return super().take_phase_metrics()


def endpoint_problem(url: str, timeout_s: float) -> str | None:
    """Why ``url`` cannot be reached (one line naming it), or ``None`` when it answers anything over HTTP."""
    try:
        httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return (
            f"{url} does not answer ({type(exc).__name__}: {exc or 'no reply'}): start the service or correct the URL"
        )
    return None
