"""Train-inference corrections against hand-computed weights."""

from __future__ import annotations

import math

import pytest
import torch

from rlzoo_estimators.corrections.none import NoCorrection
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
    with pytest.raises(Exception):
        TruncatedIS.Params(threshold=0.0)
