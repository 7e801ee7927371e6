"""The ``remote`` verifier end to end on loopback: both protocols, every unusable reply counted as a verifier error
(never a silent 0), the key variable, the start-up check, the cache across a restart, a service that dies mid-run
and the circuit that then stops the run (tests/service_testlib.py's servers; no mock of httpx)."""

from __future__ import annotations

import pytest
from service_testlib import faulty_app, serving

from rlzoo.cli import main
from rlzoo.interfaces import Sample
from rlzoo.registry import default_registry
from rlzoo.rl.scoring import score
from rlzoo.runtime.faults import FaultPolicy, StepFailure

FAST = {"backoff_s": 0.01, "max_backoff_s": 2.0, "timeout_s": 5.0, "retries": 1}
DEAD = "http://127.0.0.1:9/verify_batch"  # the discard port: nothing listens


@pytest.fixture(scope="module")
def service():
    app = faulty_app()
    with serving(app) as url:
        yield url, app


def remote(url: str, **params):
    return default_registry().create("verifier", "remote", {"url": url, **FAST, **params})


def batch(n: int = 4) -> tuple[list[Sample], list[str]]:
    samples = [Sample(prompt=f"q{i} ", answer=str(i), meta={"id": i}) for i in range(n)]
    return samples, [str(i) if i % 2 == 0 else "wrong" for i in range(n)]


def test_rlzoo_protocol_scores_each_response_and_reports_remote_metrics(service):
    url, _ = service
    verifier = remote(f"{url}/ok", batch_size=3)
    samples, responses = batch(5)
    scores = score(verifier, samples, responses)
    assert [v.reward for v in scores.verdicts] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert scores.errors == 0
    assert scores.verdicts[3].reason == "{'seen': {'id': 3}}"  # the metadata went to the service and back
    metrics = scores.metrics()
    assert metrics["remote/requests"] == 2 and metrics["remote/cache_hits"] == 0  # 5 responses in batches of 3
    assert metrics["remote/failures"] == 0 and metrics["remote/latency_p50_s"] > 0


def test_openrlhf_protocol_sends_query_prompts_labels_and_reads_rewards(service):
    url, _ = service
    samples, responses = batch(4)
    verdicts = score(remote(f"{url}/openrlhf", protocol="openrlhf"), samples, responses).verdicts
    assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("path", "params", "expected"),
    [
        ("/html", {}, "not JSON: '<html>"),
        ("/malformed", {}, "not JSON"),
        ("/empty", {}, "an empty reply"),
        ("/out_of_range", {"max_reward": 1.0}, "reward 7 outside [None, 1.0]"),
        ("/nan", {}, "not a finite number: nan"),
        ("/short", {}, "without a list 'results' of 4"),
        ("/steps/nan", {}, "steps[0].reward is not a finite number: nan"),
        ("/steps/no_span", {}, "steps[0].span is not [start, end]"),
        ("/steps/backwards", {}, "steps[0].span is not [start, end] character offsets, 0 <= start <= end: [3, 1]"),
        ("/steps/not_a_list", {}, "steps is not a list of objects"),
        ("/always500", {}, "HTTP 500"),
        ("/huge", {"max_response_bytes": 1_000_000}, "max_response_bytes"),
    ],
)
def test_an_unusable_reply_is_a_verifier_error_never_a_silent_zero(service, path, params, expected):
    url, _ = service
    scores = score(remote(f"{url}{path}", **params), *batch(4))
    assert scores.errors == 4 and scores.metrics()["verifier/errors"] == 4
    assert all(v.reward == 0.0 and expected in v.reason and url in v.reason for v in scores.verdicts), scores.verdicts[
        0
    ]
    assert scores.metrics()["remote/failures"] >= 1


def test_the_key_comes_from_the_named_variable(service, monkeypatch):
    url, _ = service
    monkeypatch.setenv("RLZOO_TEST_KEY", "sesame")
    assert score(remote(f"{url}/auth", api_key_env="RLZOO_TEST_KEY"), *batch(2)).errors == 0
    monkeypatch.delenv("RLZOO_TEST_KEY")
    problems = remote(f"{url}/auth", api_key_env="RLZOO_TEST_KEY").preflight(None, "verifier")
    assert problems == [
        ("verifier.api_key_env", "the environment variable RLZOO_TEST_KEY is not set: export it with the key")
    ]


def test_endpoint_down_at_start_stops_the_check_naming_the_url(tmp_path, capsys):
    problems = remote(DEAD).preflight(None, "verifier")
    assert [field for field, _ in problems] == ["verifier.url"] and DEAD in problems[0][1]
    config = tmp_path / "run.yaml"
    config.write_text(f"verifier: {{name: remote, url: '{DEAD}'}}\n")
    assert main(["config", "check", str(config)]) == 1
    err = capsys.readouterr().err
    assert "verifier.url" in err and DEAD in err and "Traceback" not in err


def test_the_cache_survives_a_restart_of_the_verifier(service, tmp_path):
    url, app = service
    samples, responses = batch(4)
    first = remote(f"{url}/ok", batch_size=1)
    first.use_run_folder(tmp_path)
    before = app.state.calls["/ok"]
    rewards = [v.reward for v in score(first, samples, responses).verdicts]
    assert app.state.calls["/ok"] == before + 4
    again = remote(f"{url}/ok", batch_size=1)  # a resumed run: a new object, the same run folder
    again.use_run_folder(tmp_path)
    scores = score(again, samples, responses)
    assert [v.reward for v in scores.verdicts] == rewards
    assert app.state.calls["/ok"] == before + 4  # nothing asked twice
    assert (scores.metrics()["remote/cache_hits"], scores.metrics()["remote/requests"]) == (4, 0)


def test_failures_are_not_cached(service, tmp_path):
    url, app = service
    verifier = remote(f"{url}/always500", retries=0)
    verifier.use_run_folder(tmp_path)
    score(verifier, *batch(2))
    assert len(verifier.cache) == 0


def test_a_service_that_dies_mid_run_stops_the_run_after_max_consecutive_failures(tmp_path):
    samples, responses = batch(4)
    policy = FaultPolicy(max_consecutive=2, responses_per_step=4, run_dir=tmp_path)
    with serving(faulty_app()) as url:
        verifier = remote(f"{url}/ok")
        policy.check(1, score(verifier, samples, responses).metrics())
    assert policy.streak == 0
    policy.check(2, score(verifier, samples, ["other"] * 4).metrics())  # the server is gone
    assert policy.streak == 1
    with pytest.raises(StepFailure, match=r"stopped at step 3 after 2 failed steps in a row .*verifier/errors 4"):
        policy.check(3, score(verifier, samples, ["more"] * 4).metrics())


def test_weighted_passes_the_run_folder_and_a_service_part_s_failures_on(service, tmp_path):
    url, app = service
    registry = default_registry()
    spec = {"verifiers": [{"name": "exact"}, {"name": "remote", "url": f"{url}/ok", **FAST}]}
    samples, responses = batch(2)
    first = registry.create("verifier", "weighted", spec)
    first.use_run_folder(tmp_path)
    assert [v.reward for v in score(first, samples, responses).verdicts] == [2.0, 0.0]
    again = registry.create("verifier", "weighted", spec)
    again.use_run_folder(tmp_path)
    assert score(again, samples, responses).metrics()["remote/cache_hits"] == 2  # the part's cache, resumed
    broken = registry.create(
        "verifier",
        "weighted",
        {"verifiers": [{"name": "exact"}, {"name": "remote", "url": f"{url}/always500", **FAST, "retries": 0}]},
    )
    scores = score(broken, samples, responses)
    assert scores.errors == 2 and [v.reward for v in scores.verdicts] == [0.0, 0.0]
    assert app.state.calls["/always500"] >= 1 and scores.metrics()["remote/requests"] == 1  # not re-asked per response
