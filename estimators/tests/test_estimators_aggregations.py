"""Loss aggregations: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""

from __future__ import annotations

import math

import pytest
import torch
from estimators_testlib import REGISTRY, batch_shapes, create, floats, right_padded_mask, t, tensor_of
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.errors import ConfigError

# padded positions hold large values that must not count
LOSS = [[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]]
MASK = [[1, 1, 1, 0], [1, 0, 0, 0]]
NAMES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize(
    "name, params, expected",
    [
        ("token-mean", {}, (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", {}, ((1 + 2 + 3) / 3 + 4 / 1) / 2),
        ("seq-mean-token-sum", {}, ((1 + 2 + 3) + 4) / 2),
        ("seq-mean-token-sum-norm", {}, (1 + 2 + 3 + 4) / (2 * 4)),
        ("seq-mean-token-sum-norm", {"max_tokens": 10}, (1 + 2 + 3 + 4) / (2 * 10)),
    ],
)
def test_aggregation_hand_values(name, params, expected):
    out = create("aggregation", name, **params).aggregate(t(LOSS), t(MASK))
    assert out.dim() == 0
    assert out.item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    "name, expected_row_weights",
    [
        # d loss / d L_{i,t} on response tokens
        ("token-mean", [1 / 4, 1 / 4]),
        ("seq-mean-token-mean", [1 / (2 * 3), 1 / (2 * 1)]),
        ("seq-mean-token-sum", [1 / 2, 1 / 2]),
        ("seq-mean-token-sum-norm", [1 / 8, 1 / 8]),
    ],
)
def test_aggregation_gradient_weights(name, expected_row_weights):
    loss = t(LOSS).requires_grad_()
    (grad,) = torch.autograd.grad(create("aggregation", name).aggregate(loss, t(MASK)), loss)
    w0, w1 = expected_row_weights
    torch.testing.assert_close(grad, t([[w0, w0, w0, 0.0], [w1, 0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("name", NAMES)
def test_non_finite_padding_is_ignored(name):
    loss = t([[1.0, 2.0, math.inf], [4.0, math.nan, -math.inf]]).requires_grad_()
    mask = t([[1, 1, 0], [1, 0, 0]])
    out = create("aggregation", name).aggregate(loss, mask)
    assert math.isfinite(out.item())
    (grad,) = torch.autograd.grad(out, loss)
    assert torch.isfinite(grad).all() and grad[0, 2] == 0 and grad[1, 1] == 0 and grad[1, 2] == 0


@pytest.mark.parametrize(
    "name, expected",
    [("seq-mean-token-mean", 3.0), ("seq-mean-token-sum", 6.0), ("seq-mean-token-sum-norm", 6.0 / 2)],
)
def test_seq_mean_modes_count_only_non_empty_responses(name, expected):
    # verl's agg_loss: a fully masked row counts for nothing in the number of sequences
    out = create("aggregation", name).aggregate(t([[2.0, 4.0], [9.0, 9.0]]), t([[1, 1], [0, 0]]))
    assert out.item() == pytest.approx(expected)


@pytest.mark.parametrize("name", NAMES)
def test_all_padding_batch_gives_zero(name):
    loss = t([[1.0, 2.0]]).requires_grad_()
    out = create("aggregation", name).aggregate(loss, t([[0, 0]]))
    assert out.item() == 0.0
    out.backward()  # still part of the graph


def test_max_tokens_validation():
    with pytest.raises(ConfigError, match="max_tokens"):
        REGISTRY.create("aggregation", "seq-mean-token-sum-norm", {"max_tokens": 0})
    assert create("aggregation", "seq-mean-token-sum-norm").params.max_tokens is None


@st.composite
def loss_and_mask(draw):
    lengths, width = draw(batch_shapes(max_batch=5, max_tokens=6, min_length=0))
    loss = tensor_of(draw, (len(lengths), width), floats(-10.0, 10.0))
    return loss, right_padded_mask(lengths, width), lengths


@settings(max_examples=80, deadline=None)
@given(loss_and_mask(), st.integers(1, 4))
def test_aggregations_against_reference_and_padding(data, extra):
    loss, mask, lengths = data
    rows = [loss[i, :n].tolist() for i, n in enumerate(lengths)]
    tokens = [x for row in rows for x in row]
    nonempty = [row for row in rows if row]
    reference = {
        "token-mean": sum(tokens) / len(tokens) if tokens else 0.0,
        "seq-mean-token-mean": sum(sum(r) / len(r) for r in nonempty) / len(nonempty) if nonempty else 0.0,
        "seq-mean-token-sum": sum(sum(r) for r in nonempty) / len(nonempty) if nonempty else 0.0,
        "seq-mean-token-sum-norm": sum(tokens) / (len(nonempty) * loss.shape[1]) if nonempty else 0.0,
    }
    padded_loss = torch.cat([loss, torch.full((loss.shape[0], extra), 1e6, dtype=loss.dtype)], 1)
    padded_mask = torch.cat([mask, torch.zeros(mask.shape[0], extra, dtype=mask.dtype)], 1)
    for name, expected in reference.items():
        agg = create("aggregation", name)
        assert agg.aggregate(loss, mask).item() == pytest.approx(expected, abs=1e-9), name
        # extra padding columns never matter for the two means, nor for sum-norm with a fixed T_max
        if name != "seq-mean-token-sum-norm":
            assert agg.aggregate(padded_loss, padded_mask).item() == pytest.approx(expected, abs=1e-9), name
    fixed = create("aggregation", "seq-mean-token-sum-norm", max_tokens=7)
    assert fixed.aggregate(padded_loss, padded_mask).item() == pytest.approx(fixed.aggregate(loss, mask).item())
