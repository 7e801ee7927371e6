"""The advantage phase hands the step's correction weights to the advantage source (the optimal token baselines'
``rollout_is`` reads them as verl's ``rollout_is_weights``)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlzoo.interfaces import RewardBatch
from rlzoo.registry import default_registry
from rlzoo.rl.advantages import reward_batch
from rlzoo.rl.step_record import OldLogprobs, StepRecord


def test_reward_batch_carries_the_correction_weights_and_the_declared_statistics():
    mask = torch.ones(2, 3)
    rewards = RewardBatch(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]), mask=mask)
    correction = torch.tensor([[1.0, 0.5, 2.0], [0.25, 1.0, 1.0]])
    old = OldLogprobs(
        logp=-torch.ones(2, 3),
        train=None,
        entropy=None,
        rollout=-torch.ones(2, 3),
        reference=None,
        correction=correction,
    )
    record = StepRecord(
        step=0,
        rollout=SimpleNamespace(rewards=rewards),
        old=old,
        token_stats={"sum_pi_squared": torch.full((2, 3), 0.3)},
    )
    source = default_registry().create("advantage", "optimal-token-baseline", {"rollout_is": True})
    batch = reward_batch(record, source)
    assert torch.equal(batch.rollout_is_weights, correction)
    assert set(batch.token_stats) == {"sum_pi_squared"} and torch.equal(batch.old_logprobs, old.logp)
    plain = reward_batch(record, default_registry().create("advantage", "group"))
    assert plain.token_stats == {} and plain.old_logprobs is None
