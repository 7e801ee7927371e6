"""Calling services robustly: what a verifier that scores over HTTP (``remote``, a judge) is built from.

Public API (docs/reward-services.md): :class:`ServiceParams` (the policy's fields, which a verifier's ``Params``
subclasses), :class:`ServiceClient` (concurrent JSON POSTs with timeouts, retries and a limit per endpoint),
:class:`ServiceError`, :class:`ResponseCache` and :func:`cache_key` (replies kept in the run folder),
:class:`ServiceStats` (the ``<prefix>/*`` metrics; :func:`service_metrics` picks them out of a scoring's), :class:`ServiceVerifier` (a verifier base holding all of
them) and :func:`endpoint_problem` (the preflight check that an endpoint answers).
"""

from rlzoo.services.cache import ResponseCache, cache_key
from rlzoo.services.client import ServiceClient, ServiceError, retry_after_s
from rlzoo.services.params import ServiceParams
from rlzoo.services.stats import ServiceStats, percentile, service_metrics, service_prefixes
from rlzoo.services.verifier import ServiceVerifier, endpoint_problem

__all__ = [
    "ResponseCache",
    "ServiceClient",
    "ServiceError",
    "ServiceParams",
    "ServiceStats",
    "ServiceVerifier",
    "cache_key",
    "endpoint_problem",
    "percentile",
    "retry_after_s",
    "service_metrics",
    "service_prefixes",
]
