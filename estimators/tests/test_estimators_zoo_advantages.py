"""The zoo's advantage sources (reinforce++, reinforce++-baseline, opo, gpg) and the icepop correction."""

from __future__ import annotations

import math

import pytest
import torch
from estimators_testlib import REGISTRY, create, floats, right_padded_mask, t
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.errors import ConfigError
from rlzoo.interfaces import RewardBatch


def batch(rewards, groups, lengths, width=None) -> RewardBatch:
    return RewardBatch(t(rewards), torch.tensor(groups), right_padded_mask(lengths, width or max(lengths)))


def whitened(values: list[float]) -> list[float]:
    """The documented whitening, written out: mu = sum / N, var = sum (v - mu)^2 / (N - 1)."""
    n = len(values)
    mu = sum(values) / n
    var = sum((v - mu) ** 2 for v in values) / (n - 1)
    return [(v - mu) / math.sqrt(var + 1e-8) for v in values]


def test_reinforce_pp_hand_values():
    # response 0: 2 tokens, r = 1; response 1: 3 tokens, r = 0; padding width 4
    b = batch([1.0, 0.0], [0, 0], [2, 3], width=4)
    adv = create("advantage", "reinforce++", gamma=0.5).compute(b)
    returns = [0.5, 1.0, 0.0, 0.0, 0.0]  # gamma^(later valid tokens) * r
    w = whitened(returns)
    torch.testing.assert_close(adv, t([[w[0], w[1], 0.0, 0.0], [w[2], w[3], w[4], 0.0]]), rtol=0, atol=1e-9)


def test_reinforce_pp_gamma_one_is_whitened_outcome_reward_weighted_by_length():
    b = batch([1.0, 0.0, 0.5], [0, 0, 1], [1, 3, 2])
    adv = create("advantage", "reinforce++").compute(b)
    w = whitened([1.0, 0.0, 0.0, 0.0, 0.5, 0.5])
    torch.testing.assert_close(adv, t([[w[0], 0, 0], [w[1], w[2], w[3]], [w[4], w[5], 0]]), rtol=0, atol=1e-9)
    assert adv[b.mask > 0].sum().item() == pytest.approx(0.0, abs=1e-12)


def test_reinforce_pp_baseline_hand_values():
    # groups {0: r = 1, 0}, {1: r = 3, 1}: centred 0.5, -0.5, 1, -1; lengths 2, 1, 1, 2 -> whitened over 6 tokens
    b = batch([1.0, 0.0, 3.0, 1.0], [0, 0, 1, 1], [2, 1, 1, 2])
    adv = create("advantage", "reinforce++-baseline").compute(b)
    w = whitened([0.5, 0.5, -0.5, 1.0, -1.0, -1.0])
    torch.testing.assert_close(adv, t([[w[0], w[1]], [w[2], 0.0], [w[3], 0.0], [w[4], w[5]]]), rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ["reinforce++", "reinforce++-baseline"])
def test_whitening_degenerate_batches(name):
    source = create("advantage", name)
    # one valid token: no spread, no signal -> 0
    assert torch.count_nonzero(source.compute(batch([1.0], [0], [1]))) == 0
    # all padding
    assert torch.count_nonzero(source.compute(batch([1.0, 0.0], [0, 0], [0, 0], width=2))) == 0
    # equal returns everywhere: 0, not NaN
    out = source.compute(batch([1.0, 1.0], [0, 1], [2, 2]))
    assert torch.isfinite(out).all() and torch.count_nonzero(out) == 0


def test_opo_hand_values():
    # group 0: r = 1 (length 1), 0 (length 3): baseline 1*1 / 4 = 0.25; group 1 (one response): 0
    b = batch([1.0, 0.0, 5.0], [0, 0, 1], [1, 3, 2])
    adv = create("advantage", "opo").compute(b)
    torch.testing.assert_close(adv, t([[0.75, 0.0, 0.0], [-0.25, -0.25, -0.25], [0.0, 0.0, 0.0]]))


def test_opo_equal_lengths_is_the_group_mean_baseline():
    b = batch([1.0, 0.0, 0.0, 1.0, 0.5], [0, 0, 0, 1, 1], [2, 2, 2, 3, 3])
    opo = create("advantage", "opo").compute(b)
    centred = create("advantage", "group", std_normalize=False).compute(b)
    torch.testing.assert_close(opo, centred)


def test_gpg_hand_values():
    # B = 4, rewards 1, 0, 0, 2: two non-zero -> alpha = 2; group means 0.5 and 1
    b = batch([1.0, 0.0, 0.0, 2.0], [0, 0, 1, 1], [1, 2, 2, 1])
    adv = create("advantage", "gpg").compute(b)
    torch.testing.assert_close(adv, t([[1.0, 0.0], [-1.0, -1.0], [-2.0, -2.0], [2.0, 0.0]]))


def test_gpg_all_zero_rewards_give_zero():
    adv = create("advantage", "gpg").compute(batch([0.0, 0.0], [0, 0], [2, 2]))
    assert torch.count_nonzero(adv) == 0


@st.composite
def grouped(draw):
    groups = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    index = [g for g, size in enumerate(groups) for _ in range(size)]
    rewards = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=len(index), max_size=len(index)))
    lengths = draw(st.lists(st.integers(1, 5), min_size=len(index), max_size=len(index)))
    return rewards, index, lengths


@settings(max_examples=80, deadline=None)
@given(grouped())
def test_group_baselines_sum_to_zero_within_a_group(data):
    rewards, index, lengths = data
    b = batch(rewards, index, lengths)
    opo = create("advantage", "opo").compute(b)[:, 0]
    gpg = create("advantage", "gpg").compute(b)[:, 0]
    for g in set(index):
        rows = [i for i, gi in enumerate(index) if gi == g]
        # OPO's baseline makes the length-weighted advantages cancel; GPG's the plain ones
        assert sum(opo[i].item() * lengths[i] for i in rows) == pytest.approx(0.0, abs=1e-9)
        assert sum(gpg[i].item() for i in rows) == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(grouped(), floats(0.0, 1.0))
def test_reinforce_pp_is_whitened_over_valid_tokens(data, gamma):
    rewards, index, lengths = data
    b = batch(rewards, index, lengths, width=max(lengths) + 1)
    means = {g: sum(r for r, gi in zip(rewards, index) if gi == g) / index.count(g) for g in set(index)}
    raw = {  # the values before whitening, per valid token
        "reinforce++": [r * gamma ** (n - 1 - k) for r, n in zip(rewards, lengths) for k in range(n)],
        "reinforce++-baseline": [r - means[g] for r, g, n in zip(rewards, index, lengths) for _ in range(n)],
    }
    for name, params in [("reinforce++", {"gamma": gamma}), ("reinforce++-baseline", {})]:
        adv = create("advantage", name, **params).compute(b)
        valid = adv[b.mask > 0]
        assert (adv[b.mask == 0] == 0).all()
        assert valid.mean().item() == pytest.approx(0.0, abs=1e-9)
        if valid.numel() > 1:  # std 1 up to the 1e-8 under the square root: var / (var + 1e-8)
            var = torch.tensor(raw[name], dtype=torch.float64).var().item()
            assert valid.std().item() == pytest.approx(math.sqrt(var / (var + 1e-8)), abs=1e-4)


def test_gamma_validation():
    with pytest.raises(ConfigError, match="gamma"):
        REGISTRY.create("advantage", "reinforce++", {"gamma": 1.5})


# --- IcePop --------------------------------------------------------------------------------------------------


def test_icepop_hand_values():
    mask = t([[1, 1, 1, 1, 0]])
    old_rollout = t([[-1.0, -1.0, -1.0, -1.0, -1.0]])
    w = [0.4, 0.6, 2.0, 6.0, 1.0]
    old_train = old_rollout + t([[math.log(v) for v in w]])
    out = create("correction", "icepop").weights(old_train, old_rollout, mask)
    # inside [0.5, 5] the importance weight is kept, outside (and on padding) 0
    torch.testing.assert_close(out, t([[0.0, 0.6, 2.0, 0.0, 0.0]]))


def test_icepop_sequence_level_uses_the_product():
    mask = t([[1, 1], [1, 0]])
    old_rollout = t([[-1.0, -1.0], [-1.0, -1.0]])
    old_train = old_rollout + t([[math.log(2.0), math.log(2.0)], [math.log(8.0), 0.0]])
    out = create("correction", "icepop", level="sequence").weights(old_train, old_rollout, mask)
    torch.testing.assert_close(out, t([[4.0, 4.0], [0.0, 0.0]]))


def test_icepop_validation():
    with pytest.raises(ConfigError, match="high"):
        REGISTRY.create("correction", "icepop", {"low": 3.0, "high": 2.0})
