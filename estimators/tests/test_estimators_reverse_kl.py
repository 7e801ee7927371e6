"""reverse-kl: on-policy distillation's per-token advantage, alone and composed with a task advantage."""

from __future__ import annotations

import math

import pytest
import torch
from estimators_testlib import batch_shapes, create, floats, right_padded_mask, t, tensor_of
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.errors import ConfigError
from rlzoo.interfaces import RewardBatch

# two responses of one prompt (3 and 1 policy tokens), one of another (2); width 3
MASK = right_padded_mask([3, 1, 2], 3)
OLD = t([[-1.0, -0.5, -2.0], [-0.1, -math.inf, math.nan], [-3.0, -0.2, -math.inf]])
TEACHER = t([[-0.5, -1.5, -2.0], [-0.4, 0.0, -math.inf], [-1.0, -0.7, math.nan]])


def distill_batch(
    rewards=(1.0, 0.0, 1.0), groups=(0, 0, 1), old=OLD, teacher=TEACHER, mask=MASK, **fields
) -> RewardBatch:
    return RewardBatch(
        rewards=t(list(rewards)),
        group_index=torch.tensor(list(groups)),
        mask=mask,
        teacher_logprobs=teacher,
        old_logprobs=old,
        **fields,
    )


def test_pure_distillation_is_the_teacher_minus_the_old_log_prob_per_token():
    adv = create("advantage", "reverse-kl", task=None, kl_coef=2.0).compute(distill_batch())
    expected = t([[2 * 0.5, 2 * -1.0, 0.0], [2 * -0.3, 0.0, 0.0], [2 * 2.0, 2 * -0.5, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-12)
    assert adv.dtype == torch.float64


def test_masked_positions_are_zero_whatever_the_log_probs_hold_there():
    adv = create("advantage", "reverse-kl").compute(distill_batch())  # padding holds -inf and NaN
    assert torch.isfinite(adv).all()
    assert torch.count_nonzero(adv[MASK == 0]) == 0


def test_composition_is_the_sum_of_its_parts():
    batch = distill_batch()
    composed = create("advantage", "reverse-kl", kl_coef=0.5, task_coef=3.0, task={"name": "rloo"}).compute(batch)
    distill = create("advantage", "reverse-kl", task=None).compute(batch)
    task = create("advantage", "rloo").compute(batch)
    assert torch.allclose(composed, 0.5 * distill + 3.0 * task, atol=1e-12)
    # the default task advantage is GRPO's
    default = create("advantage", "reverse-kl").compute(batch)
    assert torch.allclose(default, distill + create("advantage", "group").compute(batch), atol=1e-12)


def test_the_signal_carries_no_gradient():
    old = OLD.clone().requires_grad_()
    adv = create("advantage", "reverse-kl", task=None).compute(distill_batch(old=old))
    assert not adv.requires_grad


def test_dtype_follows_the_log_probs():
    batch = distill_batch(old=OLD.float(), teacher=TEACHER.float(), mask=MASK.float())
    assert create("advantage", "reverse-kl").compute(batch).dtype == torch.float32


def test_without_the_teachers_log_probs_it_says_what_is_missing():
    batch = RewardBatch(t([1.0]), torch.tensor([0]), right_padded_mask([1], 1), old_logprobs=t([[0.0]]))
    with pytest.raises(ValueError, match=r"RewardBatch.teacher_logprobs \(the teacher"):
        create("advantage", "reverse-kl").compute(batch)


def test_capabilities_are_the_nested_sources_plus_the_teacher():
    plain = create("advantage", "reverse-kl")
    assert plain.needs_teacher and not (plain.needs_values or plain.needs_step_rewards or plain.reads_token_rewards)
    gae = create("advantage", "reverse-kl", task={"name": "gae"})
    assert gae.needs_teacher and gae.needs_values and gae.reads_token_rewards and not gae.needs_step_rewards
    assert create("advantage", "reverse-kl", task={"name": "process"}).needs_step_rewards
    assert not type(gae).needs_values  # the class keeps the defaults: only that instance reads values


def test_the_critics_returns_are_the_nested_sources():
    token_rewards = t([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    values = t([[0.1, 0.2, 0.3], [0.5, 0.0, 0.0], [0.0, 0.4, 0.0]])
    batch = distill_batch(token_rewards=token_rewards, values=values)
    advantages, returns = create("advantage", "reverse-kl", task={"name": "gae"}).advantages_and_returns(batch)
    gae_advantages, gae_returns = create("advantage", "gae").advantages_and_returns(batch)
    assert torch.equal(returns, gae_returns)
    distill = create("advantage", "reverse-kl", task=None).compute(batch)
    assert torch.allclose(advantages, distill + gae_advantages, atol=1e-12)
    assert create("advantage", "reverse-kl", task=None).advantages_and_returns(batch)[1] is None


def test_the_nested_source_is_validated_at_its_own_fields():
    with pytest.raises(ConfigError) as err:
        create("advantage", "reverse-kl", task={"name": "gruop"})  # ("grpo" is now closest to "gdpo")
    assert err.value.problems[0][0] == "task.name" and "did you mean 'group'" in err.value.problems[0][1]
    with pytest.raises(ConfigError) as err:
        create("advantage", "reverse-kl", task={"name": "group", "std_normalise": False})
    assert err.value.problems[0][0] == "task.std_normalise" and "std_normalize" in err.value.problems[0][1]
    with pytest.raises(ConfigError, match="task.name"):
        create("advantage", "reverse-kl", task={"std_normalize": False})
    # the resolved parameters hold every parameter of the nested source
    assert create("advantage", "reverse-kl").params.task == {
        "name": "group",
        "std_normalize": True,
        "unbiased_std": True,
        "eps": 1e-6,
    }


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=batch_shapes(max_batch=5, max_tokens=6), coefs=st.tuples(floats(0, 4), floats(0, 4)))
def test_property_linear_in_both_parts_and_zero_off_the_mask(data, shape, coefs):
    lengths, width = shape
    rows = len(lengths)
    mask = right_padded_mask(lengths, width)
    old = tensor_of(data.draw, (rows, width), floats(-20, 0))
    teacher = tensor_of(data.draw, (rows, width), floats(-20, 0))
    rewards = tensor_of(data.draw, (rows,), floats(-1, 1))
    groups = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=rows, max_size=rows)))
    batch = RewardBatch(rewards, groups, mask, teacher_logprobs=teacher, old_logprobs=old)
    kl_coef, task_coef = coefs
    adv = create("advantage", "reverse-kl", kl_coef=kl_coef, task_coef=task_coef).compute(batch)
    expected = kl_coef * (teacher - old) * mask + task_coef * create("advantage", "group").compute(batch)
    assert torch.allclose(adv, expected, atol=1e-9)
    assert torch.count_nonzero(adv[mask == 0]) == 0
    # where the student already matches the teacher, only the task advantage is left
    same = RewardBatch(rewards, groups, mask, teacher_logprobs=old, old_logprobs=old)
    matched = create("advantage", "reverse-kl", task_coef=task_coef).compute(same)
    assert torch.allclose(matched, task_coef * create("advantage", "group").compute(same), atol=1e-12)
