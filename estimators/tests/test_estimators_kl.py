"""KL estimators k1, k2, k3."""

from __future__ import annotations

import math

import pytest
import torch
from estimators_testlib import create, floats, t
from hypothesis import given, settings
from hypothesis import strategies as st


def test_kl_hand_values():
    logp, ref = t([[-1.0, -2.0, -0.7]]), t([[-2.0, -1.0, -0.7]])
    torch.testing.assert_close(create("kl", "k1").estimate(logp, ref), t([[1.0, -1.0, 0.0]]))
    torch.testing.assert_close(create("kl", "k2").estimate(logp, ref), t([[0.5, 0.5, 0.0]]))
    # k3 = exp(ref - logp) - 1 - (ref - logp)
    torch.testing.assert_close(create("kl", "k3").estimate(logp, ref), t([[math.exp(-1) - 1 + 1, math.e - 1 - 1, 0.0]]))


def test_kl_gradients_at_hand_values():
    logp = t([[-1.0]]).requires_grad_()
    ref = t([[-2.0]])
    grads = {}
    for name in ["k1", "k2", "k3"]:
        (grads[name],) = torch.autograd.grad(create("kl", name).estimate(logp, ref).sum(), logp)
    assert grads["k1"].item() == pytest.approx(1.0)
    assert grads["k2"].item() == pytest.approx(1.0)  # d/dx 0.5 x^2 at x = logp - ref = 1
    assert grads["k3"].item() == pytest.approx(1.0 - math.exp(-1.0))  # d/dlogp = 1 - exp(ref - logp)


@settings(max_examples=40, deadline=None)
@given(st.lists(floats(-4.0, 4.0), min_size=2, max_size=6), st.lists(floats(-4.0, 4.0), min_size=2, max_size=6))
def test_k1_k3_are_unbiased_kl_estimates(p_logits, q_logits):
    """E_{x~p}[k(x)] = KL(p || q) for k1 and k3 (computed exactly over a small categorical support)."""
    n = min(len(p_logits), len(q_logits))
    logp = torch.log_softmax(t(p_logits[:n]), 0)
    logq = torch.log_softmax(t(q_logits[:n]), 0)
    p = logp.exp()
    kl = (p * (logp - logq)).sum().item()
    for name in ["k1", "k3"]:
        estimate = create("kl", name).estimate(logp.unsqueeze(0), logq.unsqueeze(0))[0]
        assert (p * estimate).sum().item() == pytest.approx(kl, abs=1e-9), name


@settings(max_examples=60, deadline=None)
@given(floats(-20.0, 0.0), floats(-20.0, 0.0))
def test_k2_k3_non_negative_and_zero_only_at_equality(logp, ref):
    for name in ["k2", "k3"]:
        value = create("kl", name).estimate(t([[logp]]), t([[ref]])).item()
        assert value >= 0.0
        if abs(logp - ref) > 1e-3:
            assert value > 0.0
    k1 = create("kl", "k1").estimate(t([[logp]]), t([[ref]])).item()
    assert k1 == pytest.approx(logp - ref)
