"""Advantage sources: group (GRPO / Dr.GRPO), rloo, process."""

from __future__ import annotations

import math

import pytest
import torch
from estimators_testlib import REGISTRY, create, floats, right_padded_mask, t
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.errors import ConfigError
from rlzoo.interfaces import RewardBatch


def outcome_batch(rewards, groups, lengths, width=None) -> RewardBatch:
    width = width or max(lengths)
    return RewardBatch(rewards=t(rewards), group_index=torch.tensor(groups), mask=right_padded_mask(lengths, width))


# group 0 = responses 0..3 with rewards 1, 0, 0, 1; group 1 = one response
REWARDS, GROUPS, LENGTHS = [1.0, 0.0, 0.0, 1.0, 2.0], [0, 0, 0, 0, 1], [2, 3, 1, 3, 2]


def per_response(adv: torch.Tensor, lengths) -> list[float]:
    """The advantage of each response, checking it is constant on its tokens and zero on padding."""
    values = []
    for i, n in enumerate(lengths):
        row = adv[i]
        assert torch.count_nonzero(row[n:]) == 0, "padding must get advantage 0"
        if n:
            assert torch.allclose(row[:n], row[0].expand(n)), "an outcome advantage is uniform over a response"
        values.append(row[0].item() if n else 0.0)
    return values


def test_group_unbiased_std_hand_values():
    adv = create("advantage", "group").compute(outcome_batch(REWARDS, GROUPS, LENGTHS))
    # mean 0.5; unbiased std = sqrt((4 * 0.25) / 3) = sqrt(1/3)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert per_response(adv, LENGTHS) == pytest.approx([a, -a, -a, a, 0.0], abs=1e-12)
    assert adv.shape == (5, 3) and adv.dtype == torch.float64


def test_group_biased_std_hand_values():
    adv = create("advantage", "group", unbiased_std=False, eps=0.0).compute(outcome_batch(REWARDS, GROUPS, LENGTHS))
    # biased std = 0.5
    assert per_response(adv, LENGTHS) == pytest.approx([1.0, -1.0, -1.0, 1.0, 0.0], abs=1e-12)


def test_dr_grpo_no_std_normalisation():
    adv = create("advantage", "group", std_normalize=False).compute(outcome_batch(REWARDS, GROUPS, LENGTHS))
    assert per_response(adv, LENGTHS) == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0], abs=1e-12)


def test_group_ids_need_not_be_contiguous_or_sorted():
    batch = outcome_batch([3.0, 10.0, 1.0, 20.0], [7, 2, 7, 2], [1, 1, 1, 1])
    adv = create("advantage", "group", std_normalize=False).compute(batch)
    assert per_response(adv, [1, 1, 1, 1]) == pytest.approx([1.0, -5.0, -1.0, 5.0])


@pytest.mark.parametrize("params", [{}, {"eps": 0.0}, {"unbiased_std": False, "eps": 0.0}, {"std_normalize": False}])
def test_group_identical_rewards_give_exactly_zero(params):
    # 0.1 * 3 / 3 != 0.1 in floating point: a naive (r - mean) / std would give +-1 (or nan with eps = 0)
    adv = create("advantage", "group", **params).compute(outcome_batch([0.1, 0.1, 0.1], [0, 0, 0], [2, 2, 2]))
    assert torch.count_nonzero(adv) == 0
    steps = process_batch([[0.1, 0.1], [0.1]], [[1, 2], [2]], [0, 0], [[1, 1], [1, 1]])
    assert torch.count_nonzero(create("advantage", "process", **params).compute(steps)) == 0


def test_group_single_response_group_is_zero_for_every_option():
    for params in [{}, {"unbiased_std": False}, {"std_normalize": False}, {"eps": 0.0}]:
        adv = create("advantage", "group", **params).compute(outcome_batch([5.0], [0], [3]))
        assert torch.equal(adv, torch.zeros(1, 3, dtype=torch.float64)), params


def test_group_integer_rewards_give_float_advantages():
    batch = RewardBatch(rewards=torch.tensor([1, 0]), group_index=torch.tensor([0, 0]), mask=torch.ones(2, 2))
    adv = create("advantage", "group", unbiased_std=False, eps=0.0).compute(batch)
    assert adv.is_floating_point()
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))


def test_group_params_validation():
    with pytest.raises(ConfigError, match="eps"):
        REGISTRY.create("advantage", "group", {"eps": -1e-3})
    with pytest.raises(ConfigError, match="std_norm"):
        REGISTRY.create("advantage", "group", {"std_norm": False})


@st.composite
def grouped_rewards(draw):
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    groups = [g for g, n in enumerate(sizes) for _ in range(n)]
    # rewards as verifiers give them (a few decimals), so that eps = 0 never meets an underflowing std
    reward = floats(-3.0, 3.0).map(lambda x: round(x, 3))
    rewards = draw(st.lists(reward, min_size=len(groups), max_size=len(groups)))
    return rewards, groups


@settings(max_examples=80, deadline=None)
@given(grouped_rewards())
def test_group_biased_vs_unbiased_std_property(data):
    rewards, groups = data
    batch = outcome_batch(rewards, groups, [1] * len(rewards))
    unbiased = create("advantage", "group", eps=0.0).compute(batch)[:, 0]
    biased = create("advantage", "group", unbiased_std=False, eps=0.0).compute(batch)[:, 0]
    r, g = t(rewards), torch.tensor(groups)
    for gid in g.unique():
        sel = g == gid
        n = int(sel.sum())
        # zero-sum within every group
        assert abs(unbiased[sel].sum().item()) < 1e-9 and abs(biased[sel].sum().item()) < 1e-9
        if n == 1 or r[sel].std(correction=0) < 1e-6:
            continue
        # std_unbiased = std_biased * sqrt(n / (n - 1))  =>  A_unbiased = A_biased * sqrt((n - 1) / n)
        torch.testing.assert_close(unbiased[sel], biased[sel] * math.sqrt((n - 1) / n))
        # biased-normalised advantages have unit (biased) variance
        assert biased[sel].square().mean().item() == pytest.approx(1.0, rel=1e-9)


def test_rloo_hand_values():
    adv = create("advantage", "rloo").compute(outcome_batch(REWARDS, GROUPS, LENGTHS))
    # response 0: 1 - mean(0, 0, 1) = 2/3; response 1: 0 - mean(1, 0, 1) = -2/3; group of one: 0
    assert per_response(adv, LENGTHS) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0], abs=1e-12)


def test_rloo_two_responses():
    adv = create("advantage", "rloo").compute(outcome_batch([3.0, 1.0], [4, 4], [1, 2]))
    assert per_response(adv, [1, 2]) == pytest.approx([2.0, -2.0])


@settings(max_examples=80, deadline=None)
@given(grouped_rewards())
def test_rloo_leave_one_out_definition(data):
    rewards, groups = data
    adv = create("advantage", "rloo").compute(outcome_batch(rewards, groups, [1] * len(rewards)))[:, 0]
    for i, (r_i, g_i) in enumerate(zip(rewards, groups)):
        others = [r for j, (r, g) in enumerate(zip(rewards, groups)) if g == g_i and j != i]
        expected = r_i - sum(others) / len(others) if others else 0.0
        assert adv[i].item() == pytest.approx(expected, abs=1e-9)


# -- process -------------------------------------------------------------------------------------------------


def process_batch(step_rewards, step_ends, groups, mask) -> RewardBatch:
    return RewardBatch(
        rewards=t([sum(s) for s in step_rewards]),
        group_index=torch.tensor(groups),
        mask=t(mask),
        step_rewards=step_rewards,
        step_ends=step_ends,
    )


def test_process_hand_example():
    # group 0: response 0 has steps [0, 2) -> 1.0 and [2, 4) -> 0.0, then one token after its last step;
    #          response 1 has one step [0, 3) -> 1.0 and two padding columns.
    # group 1: response 2 has a single step reward (group of one -> 0).
    batch = process_batch(
        step_rewards=[[1.0, 0.0], [1.0], [5.0]],
        step_ends=[[2, 4], [3], [2]],
        groups=[0, 0, 1],
        mask=[[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]],
    )
    adv = create("advantage", "process", eps=0.0).compute(batch)
    # group 0 step rewards 1, 0, 1: mean 2/3, unbiased std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3)
    hi, lo = (1 / 3) / math.sqrt(1 / 3), (-2 / 3) / math.sqrt(1 / 3)
    expected = t(
        [
            [hi + lo, hi + lo, lo, lo, 0.0],
            [hi, hi, hi, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(adv, expected)


def test_process_biased_and_unnormalised_options():
    batch = process_batch([[1.0, 0.0], [1.0]], [[2, 4], [3]], [0, 0], [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    biased = create("advantage", "process", unbiased_std=False, eps=0.0).compute(batch)
    std = math.sqrt(2 / 9)
    hi, lo = (1 / 3) / std, (-2 / 3) / std
    torch.testing.assert_close(biased[0], t([hi + lo, hi + lo, lo, lo, 0.0]))
    raw = create("advantage", "process", std_normalize=False).compute(batch)
    torch.testing.assert_close(raw, t([[-1 / 3, -1 / 3, -2 / 3, -2 / 3, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]]))


def test_process_counts_response_tokens_not_columns():
    # left-padded: the response tokens are columns 2..5; step 0 = response tokens 0..1, step 1 = token 2
    batch = process_batch([[2.0, 0.0]], [[2, 3]], [0], [[0, 0, 1, 1, 1, 1]])
    adv = create("advantage", "process", std_normalize=False).compute(batch)
    # mean 1 -> normalised [1, -1]; token 0, 1 -> 1 + (-1) = 0; token 2 -> -1; token 3 (after last step) -> 0
    torch.testing.assert_close(adv, t([[0.0, 0.0, 0.0, 0.0, -1.0, 0.0]]))


def test_process_response_without_steps_gets_zero():
    batch = process_batch([[], [1.0, 3.0]], [[], [1, 2]], [0, 0], [[1, 1], [1, 1]])
    adv = create("advantage", "process", std_normalize=False).compute(batch)
    torch.testing.assert_close(adv, t([[0.0, 0.0], [0.0, 1.0]]))


def test_process_needs_step_rewards():
    source = create("advantage", "process")
    assert source.needs_step_rewards is True
    assert create("advantage", "group").needs_step_rewards is False
    with pytest.raises(ValueError, match="step_rewards"):
        source.compute(outcome_batch([1.0, 0.0], [0, 0], [2, 2]))


@pytest.mark.parametrize(
    "step_rewards, step_ends, match",
    [
        ([[1.0]], [[1], [1]], "batch of 2"),
        ([[1.0], [1.0, 2.0]], [[1], [1]], "response 1"),
        ([[1.0, 2.0], [1.0]], [[2, 1], [1]], "sorted"),
    ],
)
def test_process_rejects_malformed_steps(step_rewards, step_ends, match):
    batch = RewardBatch(
        rewards=t([0.0, 0.0]),
        group_index=torch.tensor([0, 0]),
        mask=torch.ones(2, 3),
        step_rewards=step_rewards,
        step_ends=step_ends,
    )
    with pytest.raises(ValueError, match=match):
        create("advantage", "process").compute(batch)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_process_with_one_step_per_response_equals_group(data):
    # one step covering the whole response == an outcome reward: process == group on every token
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    groups = [g for g, n in enumerate(sizes) for _ in range(n)]
    lengths = data.draw(st.lists(st.integers(1, 5), min_size=len(groups), max_size=len(groups)))
    rewards = data.draw(st.lists(floats(-2.0, 2.0), min_size=len(groups), max_size=len(groups)))
    unbiased = data.draw(st.booleans())
    mask = right_padded_mask(lengths, 5)
    batch = RewardBatch(
        rewards=t(rewards),
        group_index=torch.tensor(groups),
        mask=mask,
        step_rewards=[[r] for r in rewards],
        step_ends=[[n] for n in lengths],
    )
    process = create("advantage", "process", unbiased_std=unbiased).compute(batch)
    group = create("advantage", "group", unbiased_std=unbiased).compute(batch)
    torch.testing.assert_close(process, group)
