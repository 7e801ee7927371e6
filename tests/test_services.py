"""The service policy (rlzoo.services.ServiceClient) against a real server on loopback that misbehaves on purpose
(tests/service_testlib.py): retries on 5xx, Retry-After on 429, timeouts, the size limit, 4xx not retried, the
concurrency limit, a port nothing listens on. No mock of httpx. The ``remote`` verifier: test_services_remote.py."""

from __future__ import annotations

import time

import pytest
from service_testlib import faulty_app, serving

from rlzoo.services import ServiceClient, ServiceError, ServiceParams, ServiceStats, percentile, retry_after_s

FAST = {"backoff_s": 0.01, "max_backoff_s": 2.0, "timeout_s": 5.0}


@pytest.fixture(scope="module")
def service():
    app = faulty_app()
    with serving(app) as url:
        yield url, app


def client(**params) -> tuple[ServiceClient, ServiceStats]:
    stats = ServiceStats()
    return ServiceClient(ServiceParams(**{**FAST, **params}), stats), stats


BODY = {"items": [{"prompt": "p", "response": "a", "answer": "a", "metadata": {}}]}


# -- the policy --------------------------------------------------------------------------------------------------


def test_500s_are_retried_until_they_pass_and_counted(service):
    url, app = service
    http, stats = client(retries=3)
    [reply] = http.post_all([(f"{url}/flaky/a", BODY)])
    assert reply["results"][0]["reward"] == 1.0
    assert app.state.calls["/flaky/a"] == 3
    metrics = stats.take("remote")
    assert (metrics["remote/requests"], metrics["remote/retries"], metrics["remote/failures"]) == (1, 2, 0)


def test_retries_run_out_into_a_service_error_naming_the_url(service):
    url, app = service
    http, stats = client(retries=2)
    [reply] = http.post_all([(f"{url}/always500", BODY)])
    assert isinstance(reply, ServiceError)
    assert f"{url}/always500" in str(reply) and "HTTP 500" in str(reply) and "3 tries" in str(reply)
    assert stats.take("x")["x/failures"] == 1


def test_429_waits_as_long_as_retry_after_asks(service):
    url, _ = service
    http, stats = client(retries=1)
    started = time.perf_counter()
    [reply] = http.post_all([(f"{url}/busy/a", BODY)])
    assert "results" in reply
    assert time.perf_counter() - started >= 1.0  # Retry-After: 1, not the 10 ms backoff
    assert stats.take("x")["x/retries"] == 1


def test_retry_after_reads_seconds_and_http_dates():
    from datetime import UTC, datetime

    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_s("3", now) == 3.0
    assert retry_after_s("Thu, 01 Jan 2026 12:00:05 GMT", now) == 5.0
    assert retry_after_s("soon", now) is None and retry_after_s(None, now) is None


def test_a_hang_past_the_timeout_fails_each_try(service):
    url, _ = service
    http, _ = client(timeout_s=0.3, retries=1)
    started = time.perf_counter()
    [reply] = http.post_all([(f"{url}/hang", BODY)])
    assert isinstance(reply, ServiceError) and "no reply within 0.3 s" in str(reply)
    assert time.perf_counter() - started < 3


@pytest.mark.parametrize("path", ["/huge", "/huge_stream"])
def test_a_10_mb_reply_is_refused_by_the_size_limit(service, path):
    url, _ = service
    http, _ = client(max_response_bytes=100_000)
    [reply] = http.post_all([(f"{url}{path}", BODY)])
    assert isinstance(reply, ServiceError) and "max_response_bytes (100000)" in str(reply)


def test_a_4xx_is_not_retried(service):
    url, app = service
    http, _ = client(retries=3)
    [reply] = http.post_all([(f"{url}/bad_request", BODY)])
    assert isinstance(reply, ServiceError) and "HTTP 400" in str(reply)
    assert app.state.calls["/bad_request"] == 1


def test_the_concurrency_limit_holds_per_endpoint(service):
    url, app = service
    for limit in (2, 6):
        app.state.peak = 0
        http, stats = client(concurrency=limit)
        started = time.perf_counter()
        replies = http.post_all([(f"{url}/slow", BODY)] * 6)
        elapsed = time.perf_counter() - started
        assert all("results" in r for r in replies)
        assert app.state.peak == limit
        assert elapsed >= 0.2 * 6 / limit * 0.9  # the requests overlap, as many at once as the limit allows
    assert stats.take("x")["x/latency_p95_s"] >= 0.2


def test_percentile_is_nearest_rank():
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0
    assert percentile([7.0], 95) == 7.0


def test_an_endpoint_that_nothing_listens_on_is_a_service_error():
    http, stats = client(retries=1)
    [reply] = http.post_all([("http://127.0.0.1:9/verify", BODY)])
    assert isinstance(reply, ServiceError) and "127.0.0.1:9" in str(reply)
    assert stats.take("x")["x/retries"] == 1


def test_the_final_summary_says_what_scoring_cost():
    from rlzoo.reporting.console import scoring_summary

    rows = [
        {
            "step": 0,
            "judge/requests": 4.0,
            "judge/cache_hits": 0.0,
            "judge/retries": 1.0,
            "judge/failures": 0.0,
            "judge/prompt_tokens": 100.0,
            "judge/completion_tokens": 20.0,
            "remote/requests": 2.0,
            "remote/cache_hits": 2.0,
        },
        {
            "step": 1,
            "judge/requests": 3.0,
            "judge/cache_hits": 1.0,
            "judge/retries": 0.0,
            "judge/failures": 1.0,
            "judge/prompt_tokens": 80.0,
            "judge/completion_tokens": 15.0,
            "tool/requests": 9.0,
            "eval/judge_requests": 5.0,
            "eval/judge_cache_hits": 3.0,
            "eval/judge_retries": 0.0,
            "eval/judge_failures": 0.0,
            "eval/judge_prompt_tokens": 50.0,
            "eval/judge_completion_tokens": 10.0,
            "eval/reward_mean": 0.5,
        },
        {"step": 2, "eval/judge_requests": 1.0, "eval/judge_cache_hits": 7.0, "final": 1.0},
    ]
    assert scoring_summary(rows) == [
        "scoring (judge, training steps): 7 requests, 1 cache hits, 1 retries, 1 failed; 180 prompt + 35 completion tokens",
        "scoring (judge, held-out evaluations): 6 requests, 10 cache hits, 0 retries, 0 failed; 50 prompt + 10 completion "
        "tokens",
        "scoring (remote, training steps): 2 requests, 2 cache hits, 0 retries, 0 failed",
    ]
    assert scoring_summary([{"step": 0, "reward/mean": 1.0}]) == []
