"""Batch filters, reward shapers and the entropy regulariser against hand-computed values."""

from __future__ import annotations

import pytest
import torch
from estimators_testlib import create

from rlzoo.interfaces import ResponseTooLong
from rlzoo.rl.objective import Objective


def test_dynamic_sampling_keeps_groups_whose_rewards_differ():
    f = create("batch_filter", "dynamic-sampling", max_gen_batches=3)
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, -0.2, -0.2, -0.1])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 3])
    assert f.keep(rewards, groups).tolist() == [False, True, False, True]
    assert f.max_gen_batches() == 3


def test_no_filter_keeps_every_group_from_one_generation_batch():
    f = create("batch_filter", "none")
    assert f.keep(torch.ones(4), torch.tensor([0, 0, 1, 1])).tolist() == [True, True]
    assert f.max_gen_batches() == 1


def test_dynamic_sampling_rejects_zero_generation_batches():
    from rlzoo.errors import ConfigError

    with pytest.raises(ConfigError):
        create("batch_filter", "dynamic-sampling", max_gen_batches=0)


def test_overlong_penalty_is_zero_then_linear_down_to_minus_penalty():
    s = create("reward_shaper", "overlong", buffer=4, penalty=2.0)
    lengths = torch.arange(11)  # L_max = budget = 10, so the penalty starts after 10 - 4 = 6 tokens
    got = s.shape(torch.zeros(11), lengths, budget=10)
    want = torch.tensor([0, 0, 0, 0, 0, 0, 0, -0.5, -1.0, -1.5, -2.0])
    assert torch.allclose(got, want)


def test_overlong_defaults_buffer_to_a_fifth_and_l_max_to_the_budget():
    s = create("reward_shaper", "overlong")
    assert s.limits(20) == (20, 4)
    assert s.limits(3) == (3, 1)
    assert create("reward_shaper", "overlong", max_length=30, buffer=6).limits(20) == (30, 6)
    assert s.shape(torch.zeros(2), torch.tensor([16, 20]), budget=20).tolist() == [0.0, -1.0]


def test_overlong_budget_problems():
    assert create("reward_shaper", "overlong", buffer=4).budget_problems(10) == []
    assert "buffer 12 exceeds L_max 10" in create("reward_shaper", "overlong", buffer=12).budget_problems(10)[0]
    assert "below rollout.max_new_tokens" in create("reward_shaper", "overlong", max_length=8).budget_problems(10)[0]


def test_shapers_raise_on_a_response_longer_than_their_budget():
    with pytest.raises(ResponseTooLong, match="'overlong'.*11 tokens"):
        create("reward_shaper", "overlong", buffer=2).shape(torch.zeros(2), torch.tensor([3, 11]), budget=10)
    with pytest.raises(ResponseTooLong, match="'length'.*11 tokens"):
        create("reward_shaper", "length").shape(torch.zeros(1), torch.tensor([11]), budget=10)


def test_length_penalty_is_linear():
    got = create("reward_shaper", "length", coef=0.1).shape(torch.zeros(3), torch.tensor([0, 5, 10]), budget=10)
    assert torch.allclose(got, torch.tensor([0.0, -0.5, -1.0]))


def test_entropy_regulariser_adds_minus_coef_times_the_aggregated_entropy():
    reg = create("regulariser", "entropy", coef=0.5)
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    token_mean = create("aggregation", "token-mean")
    assert reg.loss(None, entropy, mask, token_mean).item() == pytest.approx(-0.5 * 2.0)
    seq_mean = create("aggregation", "seq-mean-token-mean")
    assert reg.loss(None, entropy, mask, seq_mean).item() == pytest.approx(-0.5 * (1.5 + 3.0) / 2)


def test_objective_adds_the_regulariser_and_its_gradient():
    parts = dict(
        ratio=create("ratio", "token"),
        clipper=create("clipper", "ppo"),
        aggregation=create("aggregation", "token-mean"),
        kl=create("kl", "k3"),
    )
    plain, regularised = (
        Objective(**parts),
        Objective(**parts, regularisers=[create("regulariser", "entropy", coef=0.1)]),
    )
    assert regularised.needs_entropy and not plain.needs_entropy
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    entropy = torch.tensor([[2.0, 1.0], [0.5, 7.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    base, _ = plain(logp, logp.detach(), adv, mask)
    loss, metrics = regularised(logp, logp.detach(), adv, mask, entropy=entropy)
    assert loss.item() == pytest.approx(base.item() - 0.1 * 3.5 / 3)
    assert metrics["loss/entropy"] == pytest.approx(-0.1 * 3.5 / 3)
    loss.backward()
    assert torch.allclose(entropy.grad, -0.1 * mask / 3)  # the padded entropy gets no gradient
    with pytest.raises(ValueError, match="entropy"):
        regularised(logp, logp.detach(), adv, mask)
