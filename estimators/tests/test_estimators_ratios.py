"""Ratio estimators: token, sequence (GSPO), sequence-token (GSPO-token) against hand values and properties."""

from __future__ import annotations

import math

import pytest
import torch
from estimators_testlib import batch_shapes, create, floats, right_padded_mask, t, tensor_of
from hypothesis import given, settings
from hypothesis import strategies as st

LOGP = [[-1.0, -2.0, -0.5, -9.0], [-0.3, -4.0, -7.0, -7.0]]
OLD = [[-1.5, -1.9, -0.5, -1.0], [-0.1, -3.0, -2.0, -2.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 0]]


def test_token_ratio_hand_values():
    out = create("ratio", "token").log_ratio(t(LOGP), t(OLD), t(MASK))
    expected = t([[0.5, -0.1, 0.0, 0.0], [-0.2, -1.0, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)


def test_sequence_ratio_hand_values():
    out = create("ratio", "sequence").log_ratio(t(LOGP), t(OLD), t(MASK))
    s0 = (0.5 - 0.1 + 0.0) / 3  # mean over the 3 response tokens, not the 4 columns
    s1 = (-0.2 - 1.0) / 2
    expected = t([[s0, s0, s0, 0.0], [s1, s1, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)


def test_sequence_ratio_gradient_spreads_over_the_response():
    logp = t(LOGP).requires_grad_()
    out = create("ratio", "sequence").log_ratio(logp, t(OLD), t(MASK))
    # d(log s_0)/d logp_{0,t} = 1/3 on the 3 response tokens, 0 on padding
    (grad,) = torch.autograd.grad(out[0, 0], logp)
    torch.testing.assert_close(grad, t([[1 / 3, 1 / 3, 1 / 3, 0.0], [0.0, 0.0, 0.0, 0.0]]))


def test_sequence_token_ratio_value_is_sequence_gradient_is_own_token():
    logp = t(LOGP).requires_grad_()
    seq = create("ratio", "sequence").log_ratio(t(LOGP), t(OLD), t(MASK))
    out = create("ratio", "sequence-token").log_ratio(logp, t(OLD), t(MASK))
    assert torch.equal(out, seq)  # bit-identical values
    (grad,) = torch.autograd.grad(out[0, 1], logp, retain_graph=True)
    expected = torch.zeros(2, 4, dtype=torch.float64)
    expected[0, 1] = 1.0
    torch.testing.assert_close(grad, expected)
    (grad_pad,) = torch.autograd.grad(out[0, 3], logp)  # padding position: no gradient anywhere
    assert torch.count_nonzero(grad_pad) == 0


def test_levels():
    assert create("ratio", "token").level == "token"
    assert create("ratio", "sequence").level == "sequence"
    assert create("ratio", "sequence-token").level == "sequence"


@pytest.mark.parametrize("name", ["token", "sequence", "sequence-token"])
def test_non_finite_padding_neither_leaks_into_values_nor_gradients(name):
    logp = t([[-1.0, -2.0, -math.inf], [-0.5, math.nan, math.nan]]).requires_grad_()
    old = t([[-1.2, -2.5, -math.inf], [-0.4, -math.inf, 3.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    out = create("ratio", name).log_ratio(logp, old, mask)
    assert torch.isfinite(out).all()
    (grad,) = torch.autograd.grad((out * mask).sum(), logp)
    assert torch.isfinite(grad).all()
    assert grad[0, 2] == 0 and grad[1, 1] == 0 and grad[1, 2] == 0


@pytest.mark.parametrize("name", ["sequence", "sequence-token"])
def test_empty_response_has_ratio_one(name):
    out = create("ratio", name).log_ratio(t([[-1.0, -2.0]]), t([[-3.0, -1.0]]), t([[0, 0]]))
    assert torch.equal(out, torch.zeros(1, 2, dtype=torch.float64))


@st.composite
def ratio_inputs(draw, min_length: int = 0):
    lengths, width = draw(batch_shapes(min_length=min_length))
    shape = (len(lengths), width)
    old = tensor_of(draw, shape, floats(-8.0, 0.0))
    logp = old + tensor_of(draw, shape, floats(-2.0, 2.0))
    return logp, old, right_padded_mask(lengths, width), lengths


@settings(max_examples=60, deadline=None)
@given(ratio_inputs(), st.integers(1, 5), st.sampled_from(["sequence", "sequence-token"]), st.data())
def test_sequence_ratio_invariant_to_extra_padding(inputs, extra, name, data):
    logp, old, mask, _ = inputs
    est = create("ratio", name)
    base = est.log_ratio(logp, old, mask)
    pad_shape = (logp.shape[0], extra)
    garbage_logp = tensor_of(data.draw, pad_shape, floats(-50.0, 0.0))
    garbage_old = tensor_of(data.draw, pad_shape, floats(-50.0, 0.0))
    padded = est.log_ratio(
        torch.cat([logp, garbage_logp], 1),
        torch.cat([old, garbage_old], 1),
        torch.cat([mask, torch.zeros(pad_shape)], 1),
    )
    torch.testing.assert_close(padded[:, : logp.shape[1]], base, rtol=0, atol=1e-12)
    assert torch.count_nonzero(padded[:, logp.shape[1] :]) == 0


@settings(max_examples=60, deadline=None)
@given(ratio_inputs(), st.sampled_from(["sequence", "sequence-token"]))
def test_sequence_ratio_is_mean_of_token_log_ratios(inputs, name):
    logp, old, mask, lengths = inputs
    out = create("ratio", name).log_ratio(logp, old, mask)
    for i, n in enumerate(lengths):
        expected = (logp[i, :n] - old[i, :n]).mean().item() if n else 0.0
        for col in range(n):
            assert out[i, col].item() == pytest.approx(expected, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.data())
def test_sequence_ratio_equals_token_ratio_for_one_token_responses(batch, width, data):
    # each response is one token at a random position (left or right padding alike)
    positions = data.draw(st.lists(st.integers(0, width - 1), min_size=batch, max_size=batch))
    mask = torch.zeros(batch, width, dtype=torch.float64)
    mask[torch.arange(batch), torch.tensor(positions)] = 1.0
    old = tensor_of(data.draw, (batch, width), floats(-8.0, 0.0))
    logp = tensor_of(data.draw, (batch, width), floats(-8.0, 0.0))
    token = create("ratio", "token").log_ratio(logp, old, mask)
    for name in ["sequence", "sequence-token"]:
        torch.testing.assert_close(create("ratio", name).log_ratio(logp, old, mask), token, rtol=0, atol=1e-12)
