"""The ``remote`` verifier's reading of a service's results (pure; its calls on loopback: tests/test_services_remote.py)."""

from __future__ import annotations

import pytest

from rlzoo.errors import ConfigError
from rlzoo.registry import default_registry
from rlzoo.services import ServiceError

URL = "http://127.0.0.1:9/verify_batch"


def remote(**params):
    return default_registry().create("verifier", "remote", {"url": URL, **params})


def test_a_result_becomes_a_verdict_with_its_parts_and_correctness():
    verdict = remote().verdict({"reward": 0.5, "parts": {"format": 1, "correct": 0.0}, "correct": True, "info": "ok"})
    assert (verdict.reward, verdict.parts, verdict.correct, verdict.reason) == (
        0.5,
        {"format": 1.0, "correct": 0.0},
        True,
        "ok",
    )
    assert remote().verdict({"reward": 1}).correct is True  # no flag: reward >= 1
    assert remote().verdict({"reward": 0.9}).correct is False


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"reward": True}, "reward is not a finite number: True"),
        ({"reward": "1.0"}, "reward is not a finite number: '1.0'"),
        ({}, "reward is not a finite number: None"),
        ({"reward": float("inf")}, "reward is not a finite number: inf"),
        ({"reward": 1.0, "parts": [1.0]}, "parts is not an object"),
        ({"reward": 1.0, "parts": {"a": None}}, "part 'a' is not a finite number"),
        ([1.0], "not an object"),
    ],
)
def test_a_result_that_means_no_score_is_a_service_error(result, message):
    with pytest.raises(ServiceError, match=message.replace("(", r"\(").replace("[", r"\[")):
        remote().verdict(result)


def test_the_range_bounds_refuse_a_reward_outside_and_must_be_ordered():
    assert remote(min_reward=-1, max_reward=1).verdict({"reward": -1}).reward == -1
    with pytest.raises(ServiceError, match=r"reward 2 outside \[-1.0, 1.0\]"):
        remote(min_reward=-1, max_reward=1).verdict({"reward": 2})
    with pytest.raises(ConfigError, match="min_reward .* is above max_reward"):
        remote(min_reward=1, max_reward=0)


def test_the_protocols_ask_in_their_own_shapes():
    from rlzoo.interfaces import Sample

    samples, responses = [Sample("2+2=", "4", meta={"id": 7})], ["4"]
    assert remote()._request(samples, responses) == {
        "items": [{"prompt": "2+2=", "response": "4", "answer": "4", "metadata": {"id": 7}}]
    }
    assert remote(protocol="openrlhf")._request(samples, responses) == {
        "query": ["2+2=4"],
        "prompts": ["2+2="],
        "labels": ["4"],
    }
