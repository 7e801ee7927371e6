"""Train-inference corrections against hand-computed weights and masks."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rlzoo.interfaces.base import take_reports
from rlzoo_estimators.corrections.none import NoCorrection
from rlzoo_estimators.corrections.opsm import OffPolicySequenceMask
from rlzoo_estimators.corrections.rejection import RejectionSampling
from rlzoo_estimators.corrections.tis import TruncatedIS

TRAIN = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
ROLLOUT = torch.tensor([[-1.5, -1.0, -0.5], [-1.2, -1.0, float("-inf")]])  # -inf at padding must not leak
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def tis(**params):
    return TruncatedIS(TruncatedIS.Params(**params))


def test_token_truncate():
    w = tis(level="token", action="truncate", threshold=1.5).weights(TRAIN, ROLLOUT, MASK)
    expected = torch.tensor([[min(math.exp(0.5), 1.5), math.exp(-1.0), 1.0], [math.exp(0.2), 1.0, 0.0]])
    assert torch.allclose(w, expected)


def test_token_mask_drops_tokens_above_the_threshold():
    w = tis(level="token", action="mask", threshold=1.5).weights(TRAIN, ROLLOUT, MASK)
    expected = torch.tensor([[0.0, math.exp(-1.0), 1.0], [math.exp(0.2), 1.0, 0.0]])
    assert torch.allclose(w, expected)


def test_sequence_level_uses_the_product_of_token_ratios():
    w = tis(level="sequence", action="truncate", threshold=10.0).weights(TRAIN, ROLLOUT, MASK)
    first, second = math.exp(0.5 - 1.0 + 0.0), math.exp(0.2)
    assert torch.allclose(w, torch.tensor([[first] * 3, [second, second, 0.0]]))
    masked = tis(level="sequence", action="mask", threshold=1.1).weights(TRAIN, ROLLOUT, MASK)
    assert torch.allclose(masked, torch.tensor([[first] * 3, [0.0, 0.0, 0.0]]))


def test_weights_carry_no_gradient_and_none_is_ones():
    train = TRAIN.clone().requires_grad_(True)
    assert not tis().weights(train, ROLLOUT, MASK).requires_grad
    assert torch.equal(NoCorrection().weights(TRAIN, ROLLOUT, MASK), torch.ones_like(TRAIN))


def test_threshold_must_be_positive():
    with pytest.raises(ValidationError):
        TruncatedIS.Params(threshold=0.0)


# ------------------------------------------------------------------ tis bounds and normalisation; rejection; opsm


def test_tis_low_bound_floors_or_drops_and_normalize_divides_by_the_batch_mean():
    w = tis(level="token", action="truncate", threshold=1.5, low=0.5).weights(TRAIN, ROLLOUT, MASK)
    expected = torch.tensor([[1.5, 0.5, 1.0], [math.exp(0.2), 1.0, 0.0]])
    assert torch.allclose(w, expected)
    dropped = tis(level="token", action="mask", threshold=1.5, low=0.5).weights(TRAIN, ROLLOUT, MASK)
    assert torch.allclose(dropped, torch.tensor([[0.0, 0.0, 1.0], [math.exp(0.2), 1.0, 0.0]]))
    c = tis(level="sequence", action="truncate", threshold=10.0, normalize=True)
    first, second = math.exp(-0.5), math.exp(0.2)
    mean = (first + second) / 2  # one weight per response
    assert torch.allclose(c.weights(TRAIN, ROLLOUT, MASK), torch.tensor([[first] * 3, [second] * 2 + [0.0]]) / mean)
    assert take_reports(c) == {"correction/tis/oob_fraction": 0.0, "correction/tis/norm_factor": pytest.approx(mean)}


def test_the_base_correction_keeps_every_token():
    assert torch.equal(NoCorrection().keep(TRAIN, ROLLOUT, MASK, torch.ones_like(MASK)), torch.ones_like(MASK))


# log r = old_train - old_rollout at the valid tokens: [[0.5, -1.0, 0.0], [0.2, 0.0, pad]]
LOG_R = [[0.5, -1.0, 0.0], [0.2, 0.0]]


def k(statistic: str, x: float) -> float:
    return {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1.0 - x}[statistic]


def rejection(*criteria, importance=None):
    return RejectionSampling(RejectionSampling.Params(criteria=criteria, importance=importance))


@pytest.mark.parametrize("statistic", ["k2", "k3"])
def test_token_rejection_drops_the_tokens_over_the_bound(statistic):
    high = k(statistic, 0.5) - 1e-3  # between the statistics of log r = 0.2 and 0.5
    c = rejection({"statistic": statistic, "level": "token", "high": high})
    keep = c.keep(TRAIN, ROLLOUT, MASK, MASK) * MASK
    assert torch.equal(keep, torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))
    reports = take_reports(c)
    assert reports["correction/rejection/masked_fraction"] == pytest.approx(2 / 5)
    assert reports["correction/rejection/seq_masked_fraction"] == pytest.approx(1 / 2)
    assert float(reports[f"correction/rejection/token_{statistic}_max"]) == pytest.approx(k(statistic, -1.0))


def test_sequence_levels_pool_the_token_statistic_and_decide_for_the_whole_response():
    sums = [sum(k("k3", x) for x in row) for row in LOG_R]
    means = [s / len(row) for s, row in zip(sums, LOG_R)]
    maxes = [max(k("k3", x) for x in row) for row in LOG_R]
    for level, values in (("seq_sum", sums), ("seq_mean", means), ("seq_max", maxes)):
        c = rejection({"statistic": "k3", "level": level, "high": (values[0] + values[1]) / 2})
        keep = c.keep(TRAIN, ROLLOUT, MASK, MASK) * MASK
        assert torch.equal(keep, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])), level
        assert float(take_reports(c)[f"correction/rejection/{level}_k3_max"]) == pytest.approx(values[0])


def test_k1_bounds_the_ratio_pi_rollout_over_pi_train_on_both_sides_and_criteria_chain():
    # seq_mean k1 = -mean(log r) = [1/6, -0.1]; low defaults to 1/high
    band = rejection({"statistic": "k1", "level": "seq_mean", "high": math.exp(0.15)})
    assert torch.equal(band.keep(TRAIN, ROLLOUT, MASK, MASK) * MASK, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    lower = {"statistic": "k1", "level": "seq_mean", "low": math.exp(-0.05), "high": 10.0}
    assert torch.equal(rejection(lower).keep(TRAIN, ROLLOUT, MASK, MASK) * MASK, torch.tensor([[1.0] * 3, [0.0] * 3]))
    both = rejection(lower, {"statistic": "k2", "level": "token", "high": 0.4})  # drops row 2, and log r = -1.0
    assert torch.equal(both.keep(TRAIN, ROLLOUT, MASK, MASK) * MASK, torch.tensor([[1.0, 0.0, 1.0], [0.0] * 3]))


def test_rejection_weighs_with_its_importance_parameters():
    c = rejection({"statistic": "k3", "level": "token", "high": 1.0}, importance={"threshold": 1.5})
    assert torch.allclose(c.weights(TRAIN, ROLLOUT, MASK), tis(threshold=1.5).weights(TRAIN, ROLLOUT, MASK))
    assert take_reports(c) == {"correction/rejection/is_oob_fraction": 0.2}
    unweighted = rejection({"statistic": "k3", "level": "token", "high": 1.0})
    assert torch.equal(unweighted.weights(TRAIN, ROLLOUT, MASK), MASK)


@pytest.mark.parametrize(
    "criterion, field",
    [
        ({"statistic": "k1", "level": "seq_max", "high": 2.0}, "level"),
        ({"statistic": "k3", "level": "token", "high": 0.1, "low": 0.01}, "low"),
        ({"statistic": "k1", "level": "token", "high": 2.0, "low": 3.0}, "low"),
        ({"statistic": "k2", "level": "token", "high": 0.0}, "high"),
        ({"statistic": "k4", "level": "token", "high": 1.0}, "statistic"),
        ({"statistic": "k2", "level": "seq_median", "high": 1.0}, "level"),
    ],
)
def test_a_criterion_out_of_range_names_its_field(criterion, field):
    with pytest.raises(ValidationError) as caught:
        RejectionSampling.Params(criteria=[criterion])
    assert [e["loc"] for e in caught.value.errors()] == [("criteria", 0, field)]


def test_rejection_needs_a_criterion_and_tis_a_floor_below_its_cap():
    with pytest.raises(ValidationError):
        RejectionSampling.Params(criteria=[])
    with pytest.raises(ValidationError) as caught:
        TruncatedIS.Params(threshold=2.0, low=3.0)
    assert caught.value.errors()[0]["loc"] == ("low",)


def test_opsm_drops_only_negative_advantage_responses_that_drifted():
    # mean(old_rollout - old_train) = [1/6, -0.1]; a zero advantage counts as non-negative
    c = OffPolicySequenceMask(OffPolicySequenceMask.Params(threshold=0.1))
    for advantage, expected in ((-1.0, [[0.0] * 3, [1.0, 1.0, 0.0]]), (0.0, [[1.0] * 3, [1.0, 1.0, 0.0]])):
        keep = c.keep(TRAIN, ROLLOUT, MASK, torch.full_like(MASK, advantage) * MASK) * MASK
        assert torch.equal(keep, torch.tensor(expected)), advantage
    per_token = torch.tensor([[1.0, -1.0, 1.0], [-1.0, -1.0, 0.0]])  # a process advantage: decided per token
    assert torch.equal(c.keep(TRAIN, ROLLOUT, MASK, per_token) * MASK, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))
    assert take_reports(c) == {
        "correction/opsm/masked_fraction": pytest.approx(1 / 5),
        "correction/opsm/seq_masked_fraction": 0.5,
    }
    assert torch.equal(c.weights(TRAIN, ROLLOUT, MASK), MASK)
