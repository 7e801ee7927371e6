"""The parameters every service-backed verifier shares: one robustness policy, its defaults in one place."""

from __future__ import annotations

from pydantic import Field

from rlzoo.interfaces import Params


class ServiceParams(Params):
    """How a verifier calls its service (:class:`rlzoo.services.ServiceClient`); a verifier's ``Params`` subclasses
    this to take the policy's fields beside its own."""

    timeout_s: float = Field(
        30.0,
        gt=0,
        description="seconds one try of a request may take, connecting to the last byte; a try past it "
        "fails and is retried",
    )
    retries: int = Field(
        3, ge=0, description="tries after the first, on a connection error, a timeout, HTTP 5xx or 429"
    )
    backoff_s: float = Field(
        0.5,
        gt=0,
        description="wait before the first retry; it doubles with each retry, plus random jitter of up to "
        "backoff_s (a 429's Retry-After header replaces it)",
    )
    max_backoff_s: float = Field(30.0, gt=0, description="the longest wait between tries, Retry-After included")
    concurrency: int = Field(8, ge=1, description="requests in flight to the endpoint at once")
    max_response_bytes: int = Field(
        1_000_000, ge=1, description="a longer reply is refused (a verifier error) without being read whole"
    )
    api_key_env: str | None = Field(
        None,
        description="the environment variable holding the service's key, sent as 'Authorization: Bearer KEY'; "
        "the key itself never goes in the config or the run folder. null: no key",
    )
    cache: bool = Field(
        True,
        description="keep every scored reply in the run folder (service_cache.sqlite) and reuse it, on a "
        "resume too; replies that could not be scored are never kept",
    )
