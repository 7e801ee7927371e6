"""``needs_groups``: an advantage source declares it exactly when a batch of lone responses (one per prompt, as
``rollout.group_size: 1`` gives) leaves it nothing but zero advantages -- checked on every registered source, so a
new group-normalised source that forgets the flag (and would train on zeros) fails here."""

from __future__ import annotations

import pytest
import torch
from estimators_testlib import REGISTRY, right_padded_mask

from rlzoo.interfaces import RewardBatch

LENGTHS = [3, 4, 2, 4]


def lone_responses() -> RewardBatch:
    """Four responses to four prompts, with every field any source reads, rewards and statistics all varied."""
    g = torch.Generator().manual_seed(50)
    mask = right_padded_mask(LENGTHS, 5)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25], dtype=torch.float64)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(4), torch.tensor(LENGTHS) - 1] = rewards
    old = -(torch.rand(mask.shape, generator=g, dtype=torch.float64) + 0.1)
    return RewardBatch(
        rewards=rewards,
        group_index=torch.arange(4),
        mask=mask,
        step_rewards=[[1.0, 0.0], [0.5, 0.25], [0.0, 1.0], [0.75, 0.5]],
        step_ends=[[1, 3], [2, 4], [1, 2], [2, 4]],
        token_rewards=token_rewards,
        values=torch.rand(mask.shape, generator=g, dtype=torch.float64),
        teacher_logprobs=old - torch.rand(mask.shape, generator=g, dtype=torch.float64),
        old_logprobs=old,
        reward_parts={"correct": rewards, "format": torch.tensor([0.0, 1.0, 1.0, 0.5], dtype=torch.float64)},
        reward_baselines=torch.tensor([0.5, 0.5, 0.0, 1.0], dtype=torch.float64),
        token_stats={"sum_pi_squared": torch.exp(old) ** 2 + 0.1},
    )


@pytest.mark.parametrize("info", REGISTRY.components("advantage"), ids=lambda i: i.name)
def test_needs_groups_is_declared_exactly_by_the_sources_that_give_lone_responses_nothing(info):
    source = REGISTRY.create("advantage", info.name, {})
    advantages = source.compute(lone_responses())
    all_zero = bool((advantages == 0).all())
    assert info.cls.needs_groups == all_zero, (
        f"{info.name}: needs_groups is {info.cls.needs_groups}, but lone responses get "
        f"{'only zeros' if all_zero else 'non-zero advantages'}"
    )


def test_the_group_sources_are_the_expected_ones():
    assert sorted(i.name for i in REGISTRY.components("advantage") if i.cls.needs_groups) == [
        "gdpo",
        "gpg",
        "group",
        "grpo-passk",
        "opo",
        "reinforce++-baseline",
        "rloo",
    ]
