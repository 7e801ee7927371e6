"""One robustness policy for every call rlzoo makes to a service (a remote verifier, a judge).

Each request is a JSON POST made with httpx's async client; a batch's requests run concurrently on one event loop
(no thread per request), at most ``concurrency`` in flight per endpoint (an :class:`asyncio.Semaphore` each).
A try that fails transiently (a connection error, no reply within ``timeout_s``, HTTP 5xx or 429) is retried by
tenacity up to ``retries`` times, waiting ``backoff_s * 2**(try - 1)`` plus uniform jitter in ``[0, backoff_s]``
(at most ``max_backoff_s``), or the seconds a 429/503's ``Retry-After`` header asks for (capped the same way). A
reply that cannot be used (HTTP 4xx other than 429, longer than ``max_response_bytes``, not JSON) fails at once:
retrying would get the same. A request that fails for good is a :class:`ServiceError` in its slot of the result,
never a reward.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from rlzoo.errors import RlzooError
from rlzoo.services.params import ServiceParams
from rlzoo.services.stats import ServiceStats


class ServiceError(RlzooError):
    """A service call that failed for good (after its retries), or a reply that cannot be used."""


class _Transient(Exception):
    """A try that may succeed when repeated; ``retry_after``: the seconds the service asked to wait, if it did."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ServiceClient:
    """POSTs JSON under ``params``' policy, counting into ``stats``; ``headers`` go with every request."""

    def __init__(self, params: ServiceParams, stats: ServiceStats, headers: Mapping[str, str] | None = None) -> None:
        self.params = params
        self.stats = stats
        self.headers = dict(headers or {})
        self._backoff = wait_exponential_jitter(
            multiplier=params.backoff_s, max=params.max_backoff_s, jitter=params.backoff_s
        )

    def post_all(self, requests: list[tuple[str, Any]]) -> list[Any]:
        """POST each ``(url, json body)`` concurrently; the parsed JSON replies in order, a :class:`ServiceError`
        in the place of each request that failed. Runs its own event loop: call it from synchronous code (a
        verifier's ``verify_batch``), never from inside a running loop."""
        if not requests:
            return []
        return asyncio.run(self._post_all(requests))

    async def _post_all(self, requests: list[tuple[str, Any]]) -> list[Any]:
        limits = {url: asyncio.Semaphore(self.params.concurrency) for url, _ in requests}
        # the connection pool is as large as the endpoints' limits together: the semaphores do the limiting
        pool = httpx.Limits(max_connections=self.params.concurrency * len(limits))
        async with httpx.AsyncClient(headers=self.headers, limits=pool, timeout=self.params.timeout_s) as http:
            return await asyncio.gather(*(self._post(http, limits[url], url, body) for url, body in requests))

    async def _post(self, http: httpx.AsyncClient, limit: asyncio.Semaphore, url: str, body: Any) -> Any:
        async with limit:
            started = time.perf_counter()
            self.stats.count(requests=1)
            try:
                retrying = AsyncRetrying(
                    stop=stop_after_attempt(self.params.retries + 1),
                    wait=self._wait,
                    reraise=True,
                    retry=retry_if_exception_type(_Transient),
                    before_sleep=lambda _: self.stats.count(retries=1),
                )
                async for attempt in retrying:
                    with attempt:
                        return await self._try(http, url, body)
            except _Transient as exc:
                self.stats.count(failures=1)
                return ServiceError(f"{url}: {exc} (after {self.params.retries + 1} tries)")
            except ServiceError as exc:
                self.stats.count(failures=1)
                return exc
            finally:
                self.stats.latency(time.perf_counter() - started)

    def _wait(self, state: RetryCallState) -> float:
        failure = state.outcome.exception() if state.outcome is not None else None
        if isinstance(failure, _Transient) and failure.retry_after is not None:
            return min(max(failure.retry_after, 0.0), self.params.max_backoff_s)
        return self._backoff(state)

    async def _try(self, http: httpx.AsyncClient, url: str, body: Any) -> Any:
        try:
            # the whole try, not each read: a service that trickles bytes must not hold a request forever
            data = await asyncio.wait_for(self._read(http, url, body), self.params.timeout_s)
        except TimeoutError:
            raise _Transient(f"no reply within {self.params.timeout_s:g} s") from None
        except httpx.TransportError as exc:  # connection refused or reset, a protocol error, httpx's own timeouts
            raise _Transient(f"{type(exc).__name__}: {exc or 'connection failed'}") from None
        try:
            return json.loads(data)
        except ValueError:
            raise ServiceError(f"{url} replied with something that is not JSON: {_snippet(data)}") from None

    async def _read(self, http: httpx.AsyncClient, url: str, body: Any) -> bytes:
        limit = self.params.max_response_bytes
        async with http.stream("POST", url, json=body) as reply:
            status = reply.status_code
            if status == 429 or status >= 500:
                raise _Transient(f"HTTP {status}", retry_after=retry_after_s(reply.headers.get("retry-after")))
            declared = reply.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise ServiceError(f"{url} replied with {int(declared)} bytes, more than max_response_bytes ({limit})")
            data = bytearray()
            async for chunk in reply.aiter_bytes():
                data += chunk
                if len(data) > limit:
                    raise ServiceError(f"{url} replied with more than max_response_bytes ({limit}) bytes")
            if status >= 400:
                raise ServiceError(f"{url} answered HTTP {status}: {_snippet(bytes(data))}")
            return bytes(data)


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """The seconds a ``Retry-After`` header asks for (a number of seconds, or an HTTP date); ``None`` if absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def _snippet(data: bytes) -> str:
    text = data[:120].decode("utf-8", "replace")
    return repr(text) + ("..." if len(data) > 120 else "") if text else "an empty reply"
