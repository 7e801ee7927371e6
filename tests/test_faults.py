"""The failure policy: failed steps are ridden out, a streak of ``max_consecutive`` stops the run."""

from __future__ import annotations

import pytest

from rlzoo.runtime.faults import FaultPolicy, StepFailure
from rlzoo.util.atomic import atomic_write_text
from rlzoo.util.reductions import SkippedUpdates, Sum, UnscoredResponses

S, U = SkippedUpdates, UnscoredResponses  # the fault declarations, as the engines and rlzoo.rl.scoring report them
GOOD = {
    "train/nonfinite_steps": S(0.0),
    "verifier/errors": U(0.0),
    "verifier/timeouts": U(0.0),
    "verifier/nonfinite_rewards": U(0.0),
}
NAN_LOSS = {**GOOD, "train/nonfinite_steps": S(2.0)}
UNSCORED = {**GOOD, "verifier/errors": U(5.0), "verifier/timeouts": U(2.0), "verifier/nonfinite_rewards": U(1.0)}


def test_good_steps_and_partial_faults_are_not_failures(tmp_path):
    policy = FaultPolicy(1, responses_per_step=8, run_dir=tmp_path)
    for metrics in (GOOD, {**GOOD, "verifier/errors": 7.0}, {"eval/accuracy": 0.5}):
        policy.check(0, metrics)
    assert policy.streak == 0


@pytest.mark.parametrize(("metrics", "cause"), [(NAN_LOSS, "not finite"), (UNSCORED, "none of the 8 responses")])
def test_a_streak_stops_the_run_naming_the_cause_and_the_checkpoint(tmp_path, metrics, cause):
    (tmp_path / "checkpoints" / "step_000004").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000004" / "state.json").write_text('{"completed_steps": 4}')
    atomic_write_text(tmp_path / "checkpoints" / "latest", "step_000004")
    policy = FaultPolicy(3, responses_per_step=8, run_dir=tmp_path)
    policy.check(5, metrics)
    policy.check(6, metrics)
    with pytest.raises(StepFailure) as err:
        policy.check(7, metrics)
    message = str(err.value)
    assert "stopped at step 7" in message and "3 failed steps in a row" in message and cause in message
    assert "train.max_consecutive_failures: 3" in message and "step_000004" in message and "\n" not in message


def test_a_good_step_breaks_the_streak(tmp_path):
    policy = FaultPolicy(2, responses_per_step=8, run_dir=tmp_path)
    for step in range(9):  # failed, good, failed, ..., good
        policy.check(step, NAN_LOSS if step % 2 else GOOD)
    policy.check(9, NAN_LOSS)
    with pytest.raises(StepFailure, match="no checkpoint had been written yet"):
        policy.check(10, UNSCORED)  # different causes in a row still make a streak


def test_the_policy_reads_declarations_not_metric_names(tmp_path):
    policy = FaultPolicy(1, responses_per_step=8, run_dir=tmp_path)
    # declared faults under keys the policy has never heard of
    assert "1 update(s) skipped, engine/whatever" in policy.failure({"engine/whatever": S(1.0)})
    unscored = policy.failure({"judge/crashed": U(6.0), "judge/slow": U(2.0)})
    assert "none of the 8 responses" in unscored and "judge/crashed 6" in unscored and "judge/slow 2" in unscored
    assert policy.failure({"judge/crashed": U(7.0)}) is None  # one response was scored
    # the old names holding plain numbers (or a plain declared Sum) are not faults
    plain = {"train/nonfinite_steps": 3.0, "verifier/errors": 8.0, "verifier/timeouts": 8.0, "x/count": Sum(9.0)}
    assert policy.failure(plain) is None
    policy.check(0, plain)
    assert policy.streak == 0
