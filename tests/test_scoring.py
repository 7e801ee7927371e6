"""A verifier that raises, hangs or returns a non-finite reward costs those responses their reward, never the run."""

from __future__ import annotations

import logging
import math
import threading
import time

from rlzoo.interfaces import Sample, Verdict, Verifier
from rlzoo.rl.scoring import score, step_token_ends
from rlzoo.util.reductions import UnscoredResponses


class Fragile(Verifier):
    name = "fragile"

    def verify(self, sample: Sample, response: str) -> Verdict:
        if response == "boom":
            raise RuntimeError("cannot parse")
        return Verdict(1.0 if response == sample.answer else 0.0)


def test_a_crashing_verifier_gives_zero_and_is_counted():
    samples = [Sample("1+1=", "2")] * 4
    result = score(Fragile(), samples, ["2", "boom", "3", "boom"])
    assert [v.reward for v in result.verdicts] == [1.0, 0.0, 0.0, 0.0]
    assert result.errors == 2
    assert "RuntimeError" in result.verdicts[1].reason


def test_no_errors_when_the_verifier_is_sound():
    result = score(Fragile(), [Sample("1+1=", "2")] * 2, ["2", "3"])
    assert result.errors == 0 and [v.reward for v in result.verdicts] == [1.0, 0.0]


def test_step_spans_map_to_token_ends():
    ends = [1, 2, 3, 4, 5, 6, 6]  # "8;6;10" one character per token, then <eos>, which decodes to nothing
    assert step_token_ends([(0, 1), (2, 3), (4, 6)], ends) == [1, 3, 6]


# -- faults: hangs and non-finite rewards -----------------------------------------------------------------------


class Hangs(Verifier):
    """Hangs on "hang" until released; the batch call always raises, so responses are scored one by one."""

    name = "hangs"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def verify_batch(self, samples, responses):
        raise RuntimeError("no batch mode today")

    def verify(self, sample: Sample, response: str) -> Verdict:
        if response == "hang":
            self.release.wait(30)
        return Verdict(1.0 if response == sample.answer else 0.0)


class HangsInBatch(Verifier):
    name = "hangs-in-batch"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def verify_batch(self, samples, responses):
        self.release.wait(30)
        return [Verdict(1.0)] * len(responses)


def test_responses_not_scored_in_time_get_zero_and_are_counted():
    verifier = Hangs()
    start = time.monotonic()
    result = score(verifier, [Sample("1+1=", "2")] * 4, ["2", "hang", "2", "2"], timeout_s=0.5)
    assert time.monotonic() - start < 5
    verifier.release.set()
    assert [v.reward for v in result.verdicts] == [1.0, 0.0, 0.0, 0.0]  # the first was scored before the hang
    assert (result.errors, result.timeouts, result.nonfinite) == (0, 3, 0)
    assert "timeout" in result.verdicts[1].reason
    assert result.metrics()["verifier/timeouts"] == 3.0


def test_a_hanging_verify_batch_times_out_the_whole_batch():
    verifier = HangsInBatch()
    result = score(verifier, [Sample("1+1=", "2")] * 3, ["2", "2", "2"], timeout_s=0.3)
    verifier.release.set()
    assert [v.reward for v in result.verdicts] == [0.0] * 3 and result.timeouts == 3 and result.failed == 3


def test_a_verifier_that_finishes_in_time_is_unaffected_by_the_timeout():
    result = score(Fragile(), [Sample("1+1=", "2")] * 3, ["2", "boom", "3"], timeout_s=10)
    assert [v.reward for v in result.verdicts] == [1.0, 0.0, 0.0]
    assert (result.errors, result.timeouts, result.nonfinite) == (1, 0, 0)


class Wild(Verifier):
    name = "wild"

    def verify(self, sample: Sample, response: str) -> Verdict:
        values = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
        if response == "steps":
            return Verdict(1.0, step_rewards=[0.5, math.nan], step_spans=[(0, 1), (1, 2)])
        return Verdict(values.get(response, 1.0))


def test_non_finite_rewards_score_zero_are_counted_and_warned(caplog):
    with caplog.at_level(logging.WARNING, logger="rlzoo.rl.scoring"):
        result = score(Wild(), [Sample("1+1=", "2")] * 5, ["2", "nan", "inf", "-inf", "steps"])
    assert [v.reward for v in result.verdicts] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert result.verdicts[4].step_rewards == [0.0, 0.0] and result.verdicts[4].step_spans == [(0, 1), (1, 2)]
    assert (result.errors, result.timeouts, result.nonfinite) == (0, 0, 4)
    assert result.metrics()["verifier/nonfinite_rewards"] == 4.0
    assert all(type(v) is UnscoredResponses for v in result.metrics().values())  # what the fault policy reads
    assert "non-finite reward" in caplog.text


def test_a_batch_of_the_wrong_length_falls_back_to_one_call_per_response():
    class Short(Fragile):
        def verify_batch(self, samples, responses):
            return [Verdict(1.0)]

    result = score(Short(), [Sample("1+1=", "2")] * 2, ["2", "3"])
    assert [v.reward for v in result.verdicts] == [1.0, 0.0] and result.errors == 0


def test_an_exception_in_place_of_a_verdict_is_that_response_s_error_and_the_others_are_not_rescored(caplog):
    class PerResponse(Fragile):
        calls = 0

        def verify_batch(self, samples, responses):
            self.calls += 1
            return [
                ConnectionError("service down") if r == "lost" else Fragile.verify(self, s, r)
                for s, r in zip(samples, responses)
            ]

        def verify(self, sample, response):
            raise AssertionError("verify_batch answered for every response: nothing is scored twice")

    verifier = PerResponse()
    with caplog.at_level(logging.WARNING, logger="rlzoo.rl.scoring"):
        result = score(verifier, [Sample("1+1=", "2")] * 4, ["2", "lost", "3", "lost"])
    assert [r.getMessage() for r in caplog.records] == [
        "verifier fragile could not score 2 of 4 responses (the first: service down)"
    ]  # one line, not one each
    assert [v.reward for v in result.verdicts] == [1.0, 0.0, 0.0, 0.0]
    assert result.errors == 2 and result.metrics()["verifier/errors"] == 2 and verifier.calls == 1
    assert result.verdicts[1].reason == "verifier error: ConnectionError: service down"
