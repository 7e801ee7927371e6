"""The zoo's policy losses: cispo, sapo, gmpo, kl-cov, clip-cov, and the gpg ratio, on hand values and properties."""

from __future__ import annotations

import math

import pytest
import torch
from estimators_testlib import REGISTRY, batch_shapes, create, floats, right_padded_mask, t, tensor_of
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.errors import ConfigError
from rlzoo.rl.objective import Objective


def objective(clipper, ratio="token", aggregation="token-mean"):
    return Objective(
        ratio=create("ratio", ratio) if isinstance(ratio, str) else ratio,
        clipper=clipper,
        aggregation=create("aggregation", aggregation),
        kl=create("kl", "k3"),
    )


def loss_and_grad(obj, logp, old, adv, mask, **kwargs):
    logp = t(logp).requires_grad_()
    loss, metrics = obj(logp, t(old), t(adv), t(mask), **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), metrics, grad


@st.composite
def batches(draw, uniform_advantage: bool = True, delta: float = 1.0, min_length: int = 1):
    lengths, width = draw(batch_shapes(max_batch=4, max_tokens=6, min_length=min_length))
    shape = (len(lengths), width)
    mask = right_padded_mask(lengths, width)
    old = tensor_of(draw, shape, floats(-5.0, -0.01))
    logp = old + tensor_of(draw, shape, floats(-delta, delta))
    if uniform_advantage:
        adv = tensor_of(draw, (shape[0], 1), floats(-2.0, 2.0)).expand(shape) * mask
    else:
        adv = tensor_of(draw, shape, floats(-2.0, 2.0)) * mask
    return logp, old, adv, mask


# --- CISPO ---------------------------------------------------------------------------------------------------


def test_cispo_hand_values():
    clipper = create("clipper", "cispo", eps_low=0.2, eps_high=0.28)
    ratio = t([[0.5, 1.0, 1.5, 1.5]]).requires_grad_()
    adv = t([[-1.0, 2.0, 1.0, -1.0]])
    out = clipper.clip(ratio, adv)
    # weights clip(r) = 0.8, 1.0, 1.28, 1.28; loss value = -clip(r) * A
    torch.testing.assert_close(out.loss.detach(), t([[0.8, -2.0, -1.28, 1.28]]))
    (grad,) = torch.autograd.grad(out.loss.sum(), ratio)
    # d/d rho of -sg(clip(r)/r) * r * A = -clip(r)/r * A: never 0 where A != 0
    torch.testing.assert_close(grad, t([[0.8 / 0.5, -2.0, -1.28 / 1.5, 1.28 / 1.5]]))
    # clipped = weight truncated, whatever the sign of A (verl's meaning)
    assert out.clipped_low.tolist() == [[True, False, False, False]]
    assert out.clipped_high.tolist() == [[False, False, True, True]]


def test_cispo_gradient_is_truncated_weight_times_advantage_times_grad_logp():
    obj = objective(create("clipper", "cispo", eps_low=0.2, eps_high=0.28))
    old = [[-1.0, -1.0, -1.0]]
    logp = [[-1.0 + math.log(0.5), -1.0, -1.0 + math.log(1.5)]]
    loss, metrics, grad = loss_and_grad(obj, logp, old, [[1.0, -2.0, 3.0]], [[1, 1, 1]])
    # d L / d logp_t = -clip(r_t) A_t / N
    torch.testing.assert_close(grad, t([[-0.8 * 1.0 / 3, 2.0 / 3, -1.28 * 3.0 / 3]]))
    assert metrics["clip/fraction"] == pytest.approx(2 / 3)


@settings(max_examples=80, deadline=None)
@given(batches(uniform_advantage=False, delta=3.0), floats(0.0, 1.0), floats(0.0, 5.0))
def test_cispo_never_zeroes_a_gradient_where_advantage_is_nonzero(inputs, eps_low, eps_high):
    logp, old, adv, mask = inputs
    obj = objective(create("clipper", "cispo", eps_low=eps_low, eps_high=eps_high))
    _, _, grad = loss_and_grad(obj, logp, old, adv, mask)
    live = (mask > 0) & (adv != 0)
    assert (grad[live] != 0).all()
    assert (grad[mask == 0] == 0).all()
    # and its sign is always -sign(A): the truncated weight is positive
    assert torch.equal(torch.sign(grad[live]), -torch.sign(adv[live]))


# --- SAPO ----------------------------------------------------------------------------------------------------


def test_sapo_hand_values():
    clipper = create("clipper", "sapo", tau_pos=1.0, tau_neg=2.0)
    ratio = t([[1.0, 2.0, 1.0]]).requires_grad_()
    adv = t([[1.0, 1.0, -1.0]])
    out = clipper.clip(ratio, adv)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = [-4 * sig(0.0) * 1, -4 * sig(1.0) * 1, (4 / 2) * sig(0.0)]
    torch.testing.assert_close(out.loss.detach(), t([expected]))
    (grad,) = torch.autograd.grad(out.loss.sum(), ratio)
    # d/d rho = -4 sigmoid'(tau (rho - 1)) A; sigmoid'(0) = 1/4, so the slope at rho = 1 is -A for every tau
    assert grad[0, 0].item() == pytest.approx(-1.0) and grad[0, 2].item() == pytest.approx(1.0)
    assert grad[0, 1].item() == pytest.approx(-4 * sig(1.0) * (1 - sig(1.0)))
    assert not out.clipped_low.any() and not out.clipped_high.any()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(floats(0.0, 20.0), floats(-2.0, 2.0)), min_size=1, max_size=8))
def test_sapo_gradient_is_below_the_plain_surrogate_and_never_zero(pairs):
    ratio = t([[r for r, _ in pairs]]).requires_grad_()
    adv = t([[a for _, a in pairs]])
    (grad,) = torch.autograd.grad(create("clipper", "sapo").clip(ratio, adv).loss.sum(), ratio)
    # |dL/drho| = 4 s (1 - s) |A| <= |A| (the unclipped surrogate's), same sign, zero only where A = 0
    assert (grad.abs() <= adv.abs() + 1e-12).all()
    live = adv != 0
    assert torch.equal(torch.sign(grad[live]), -torch.sign(adv[live]))


# --- GMPO ----------------------------------------------------------------------------------------------------


def test_gmpo_hand_values():
    # one response of 3 tokens, A = +1: log-ratios 0.5 (clipped to 0.4), -0.6 (kept: min picks it), 0.1
    obj = objective(create("clipper", "gmpo", eps_low=0.4, eps_high=0.4), aggregation="seq-mean-token-mean")
    old = [[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]]
    logp = [[-0.5, -1.6, -0.9, 5.0], [-2.5, -1.9, -2.0, -2.0]]
    adv = [[1.0, 1.0, 1.0, 0.0], [-2.0, -2.0, 0.0, 0.0]]
    mask = [[1, 1, 1, 0], [1, 1, 0, 0]]
    loss, metrics, grad = loss_and_grad(obj, logp, old, adv, mask)
    s0 = math.exp((0.4 - 0.6 + 0.1) / 3)
    # A = -2: log-ratios -0.5 (clipped to -0.4: max picks the clamp), 0.1 (kept)
    s1 = math.exp((-0.4 + 0.1) / 2)
    assert loss == pytest.approx((-1.0 * s0 + 2.0 * s1) / 2)
    # gradient flows through the unclipped tokens only: dL_i/dlogp_t = -Abar_i s_i / |y_i|, halved by the mean
    expected = [[0.0, -s0 / 3 / 2, -s0 / 3 / 2, 0.0], [0.0, 2.0 * s1 / 2 / 2, 0.0, 0.0]]
    torch.testing.assert_close(grad, t(expected))
    assert metrics["clip/high_fraction"] == pytest.approx(1 / 5)
    assert metrics["clip/low_fraction"] == pytest.approx(1 / 5)


@settings(max_examples=60, deadline=None)
@given(batches(uniform_advantage=True, delta=1.0))
def test_gmpo_with_huge_eps_is_the_unclipped_sequence_ratio(inputs):
    logp, old, adv, mask = inputs
    gmpo = objective(create("clipper", "gmpo", eps_low=1e9, eps_high=1e9), aggregation="seq-mean-token-mean")
    gspo = objective(create("clipper", "none"), ratio="sequence", aggregation="seq-mean-token-mean")
    loss_a, metrics_a, grad_a = loss_and_grad(gmpo, logp, old, adv, mask)
    loss_b, _, grad_b = loss_and_grad(gspo, logp, old, adv, mask)
    assert loss_a == pytest.approx(loss_b, abs=1e-12)
    torch.testing.assert_close(grad_a, grad_b, rtol=1e-9, atol=1e-12)
    assert metrics_a["clip/fraction"] == 0.0


@settings(max_examples=60, deadline=None)
@given(batches(uniform_advantage=True, delta=1.5), floats(0.0, 0.5), floats(0.0, 0.5))
def test_gmpo_flags_mark_exactly_the_tokens_without_gradient(inputs, eps_low, eps_high):
    logp, old, adv, mask = inputs
    obj = objective(create("clipper", "gmpo", eps_low=eps_low, eps_high=eps_high), aggregation="seq-mean-token-mean")
    log_r = (logp - old) * mask
    # keep clear of the clip boundaries, where the flag and the gradient may disagree by rounding
    near = ((log_r - eps_high).abs() < 1e-9) | ((log_r + eps_low).abs() < 1e-9)
    if near.any():
        return
    x = logp.clone().requires_grad_()
    loss, metrics = obj(x, old, adv, mask)
    loss.backward()
    live = (mask > 0) & (adv != 0)
    clipped = ((adv > 0) & (log_r > eps_high)) | ((adv < 0) & (log_r < -eps_low))
    assert torch.equal((x.grad == 0)[live], clipped[live])
    n = mask.sum().item()
    assert metrics["clip/fraction"] == pytest.approx(clipped[mask > 0].sum().item() / n)


# --- GPG -----------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(batches(uniform_advantage=False, delta=0.0), st.sampled_from(["token-mean", "seq-mean-token-mean"]))
def test_gpg_gradient_equals_reinforce_on_policy(inputs, aggregation):
    logp, old, adv, mask = inputs
    obj = objective(create("clipper", "none"), ratio="gpg", aggregation=aggregation)
    loss, metrics, grad = loss_and_grad(obj, logp, old, adv, mask)
    # REINFORCE: L = aggregate(-A * logp), written out
    x = t(logp).requires_grad_()
    reinforce = create("aggregation", aggregation).aggregate(-adv * x, mask)
    (expected,) = torch.autograd.grad(reinforce, x)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)
    # and on-policy it is also the token-ratio surrogate's gradient
    token = objective(create("clipper", "none"), ratio="token", aggregation=aggregation)
    torch.testing.assert_close(loss_and_grad(token, logp, old, adv, mask)[2], expected, rtol=0, atol=1e-12)
    assert metrics["ratio/mean"] == 1.0 and metrics["clip/fraction"] == 0.0


def test_gpg_ratio_ignores_the_old_policy():
    obj = objective(create("clipper", "none"), ratio="gpg")
    _, _, grad_a = loss_and_grad(obj, [[-1.0, -2.0]], [[-1.0, -2.0]], [[1.0, -1.0]], [[1, 1]])
    _, _, grad_b = loss_and_grad(obj, [[-1.0, -2.0]], [[-5.0, -0.1]], [[1.0, -1.0]], [[1, 1]])
    torch.testing.assert_close(grad_a, grad_b)
    torch.testing.assert_close(grad_a, t([[-0.5, 0.5]]))


# --- KL-Cov --------------------------------------------------------------------------------------------------


def test_kl_cov_hand_values():
    # 4 valid tokens; A = 1, 1, -1, -1 (mean 0); logp = -1, -3, -1, -3 (mean -2)
    # c = (1)(1), (1)(-1), (-1)(1), (-1)(-1) = 1, -1, -1, 1 -> select_fraction 0.5 picks the two c = 1 tokens
    old = [[-1.5, -3.0, -1.0, -2.0, 0.0]]
    logp = [[-1.0, -3.0, -1.0, -3.0, 7.0]]
    adv = [[1.0, 1.0, -1.0, -1.0, 0.0]]
    mask = [[1, 1, 1, 1, 0]]
    obj = objective(create("clipper", "kl-cov", select_fraction=0.5, kl_coef=2.0), aggregation="token-mean")
    loss, metrics, grad = loss_and_grad(obj, logp, old, adv, mask)
    r = [math.exp(0.5), 1.0, 1.0, math.exp(-1.0)]
    per_token = [-r[0] + 2 * 0.5, -r[1], r[2], r[3] + 2 * 1.0]
    assert loss == pytest.approx(sum(per_token) / 4)
    expected = [(-r[0] + 2.0) / 4, -1.0 / 4, 1.0 / 4, (r[3] - 2.0) / 4, 0.0]
    torch.testing.assert_close(grad, t([expected]))
    assert metrics["clip/cov_fraction"] == pytest.approx(0.5)
    assert metrics["clip/fraction"] == 0.0


def test_kl_cov_selects_at_least_one_token():
    obj = objective(create("clipper", "kl-cov"), aggregation="token-mean")  # 0.0002 of 3 tokens -> still 1
    _, metrics, _ = loss_and_grad(obj, [[-1.0, -2.0, -3.0]], [[-1.1, -2.0, -3.0]], [[1.0, 0.0, -1.0]], [[1, 1, 1]])
    assert metrics["clip/cov_fraction"] == pytest.approx(1 / 3)


# --- Clip-Cov ------------------------------------------------------------------------------------------------


def clip_cov_case():
    # valid tokens: A = 2, 2, -2, -2, 2 (mean 0.4); logp = -1, -1, -4, -4, -1 (mean -2.2)
    # c = 1.6*1.2 = 1.92 (x3 for the A = 2 tokens), (-2.4)(-1.8) = 4.32 (x2)
    old = [[-1.0, -1.0 - math.log(1.5), -4.0, -4.0, -1.0, 0.0]]
    logp = [[-1.0, -1.0, -4.0, -4.0, -1.0, 3.0]]
    adv = [[2.0, 2.0, -2.0, -2.0, 2.0, 0.0]]
    mask = [[1, 1, 1, 1, 1, 0]]
    return logp, old, adv, mask


def test_clip_cov_detaches_the_candidates_and_never_the_clipped():
    logp, old, adv, mask = clip_cov_case()
    # token 1 has ratio 1.5 > 1.28 with A > 0: PPO-clipped, never a candidate. lb = 2 keeps the 4.32 tokens only
    clipper = create("clipper", "clip-cov", eps_low=0.2, eps_high=0.28, select_fraction=1.0, lb=2.0, ub=5.0)
    loss, metrics, grad = loss_and_grad(objective(clipper), logp, old, adv, mask, seed=0)
    # tokens 2, 3 zeroed; token 0, 4: -A = -2 each; token 1: clipped loss -1.28 * 2
    assert loss == pytest.approx((-2.0 - 2.56 - 2.0) / 5)
    torch.testing.assert_close(grad, t([[-2.0 / 5, 0.0, 0.0, 0.0, -2.0 / 5, 0.0]]))
    assert metrics["clip/cov_fraction"] == pytest.approx(2 / 5)
    assert metrics["clip/fraction"] == pytest.approx(1 / 5)


def test_clip_cov_draw_is_seeded():
    logp, old, adv, mask = clip_cov_case()
    # 4 candidates with 1 < c < 5 (tokens 0, 2, 3, 4); select_fraction 0.2 of 5 tokens -> 1 is drawn
    clipper = create("clipper", "clip-cov", eps_low=0.2, eps_high=0.28, select_fraction=0.2)
    obj = objective(clipper)
    zeroed = []
    for seed in range(12):
        _, metrics, grad = loss_and_grad(obj, logp, old, adv, mask, seed=seed)
        assert metrics["clip/cov_fraction"] == pytest.approx(1 / 5)
        _, _, again = loss_and_grad(obj, logp, old, adv, mask, seed=seed)
        assert torch.equal(grad, again)  # the same seed draws the same token
        dead = (grad[0, :5] == 0).nonzero().reshape(-1).tolist()
        assert len(dead) == 2 and 1 in dead  # token 1 is PPO-clipped; one candidate is detached
        zeroed.append(next(d for d in dead if d != 1))
    assert set(zeroed) <= {0, 2, 3, 4} and len(set(zeroed)) > 1  # different seeds draw different tokens


def test_clip_cov_without_candidates_is_ppo():
    logp, old, adv, mask = clip_cov_case()
    clip_cov = objective(create("clipper", "clip-cov", eps_low=0.2, eps_high=0.28, lb=10.0, ub=11.0))
    ppo = objective(create("clipper", "ppo", eps_low=0.2, eps_high=0.28))
    a, b = loss_and_grad(clip_cov, logp, old, adv, mask), loss_and_grad(ppo, logp, old, adv, mask)
    assert a[0] == b[0] and torch.equal(a[2], b[2]) and a[1]["clip/cov_fraction"] == 0.0


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("clip-cov", {"lb": 5.0, "ub": 1.0}, "ub"),
        ("clip-cov", {"select_fraction": 0.0}, "select_fraction"),
        ("kl-cov", {"select_fraction": 1.5}, "select_fraction"),
        ("kl-cov", {"kl_coef": -1.0}, "kl_coef"),
        ("cispo", {"eps_low": 1.5}, "eps_low"),
        ("sapo", {"tau_pos": 0.0}, "tau_pos"),
        ("gmpo", {"eps_high": -0.1}, "eps_high"),
    ],
)
def test_params_validation(name, params, field):
    with pytest.raises(ConfigError, match=field):
        REGISTRY.create("clipper", name, params)


def test_defaults_are_the_contract():
    assert create("clipper", "cispo").params.model_dump() == {"eps_low": 1.0, "eps_high": 4.0}
    assert create("clipper", "sapo").params.model_dump() == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert create("clipper", "gmpo").params.model_dump() == {"eps_low": 0.4, "eps_high": 0.4}
    assert create("clipper", "kl-cov").params.model_dump() == {"select_fraction": 0.0002, "kl_coef": 1.0}
    assert create("clipper", "clip-cov").params.model_dump() == {
        "eps_low": 0.2,
        "eps_high": 0.2,
        "select_fraction": 0.0002,
        "lb": 1.0,
        "ub": 5.0,
    }


@pytest.mark.parametrize("name", ["cispo", "sapo", "gmpo", "kl-cov", "clip-cov"])
def test_all_padding_rows_and_batches_are_finite(name):
    obj = objective(create("clipper", name), aggregation="seq-mean-token-mean")
    loss, metrics, grad = loss_and_grad(
        obj, [[-1.0, math.nan], [-2.0, -1.0]], [[-1.0, 0.0], [-1.5, -1.0]], [[0.0, 0.0], [1.0, 1.0]], [[0, 0], [1, 1]]
    )
    assert math.isfinite(loss) and torch.isfinite(grad).all() and (grad[0] == 0).all()
    loss, metrics, grad = loss_and_grad(obj, [[-1.0]], [[-1.0]], [[0.0]], [[0]])
    assert loss == 0.0 and all(math.isfinite(v) for v in metrics.values())


@settings(max_examples=50, deadline=None)
@given(batches(uniform_advantage=False, delta=1.0, min_length=0), floats(0.01, 1.0))
def test_kl_cov_without_penalty_is_the_plain_surrogate(inputs, fraction):
    logp, old, adv, mask = inputs
    kl_cov = objective(create("clipper", "kl-cov", select_fraction=fraction, kl_coef=0.0))
    plain = objective(create("clipper", "none"))
    a, b = loss_and_grad(kl_cov, logp, old, adv, mask), loss_and_grad(plain, logp, old, adv, mask)
    assert a[0] == pytest.approx(b[0], abs=1e-12)
    torch.testing.assert_close(a[2], b[2], rtol=0, atol=1e-12)
    n = int(mask.sum().item())
    assert a[1]["clip/cov_fraction"] == pytest.approx(max(1, int(n * fraction)) / n if n else 0.0)


@settings(max_examples=50, deadline=None)
@given(batches(uniform_advantage=False, delta=1.0), floats(0.01, 1.0), st.integers(0, 2**31 - 2))
def test_clip_cov_only_detaches_unclipped_candidates(inputs, fraction, seed):
    logp, old, adv, mask = inputs
    params = {"eps_low": 0.2, "eps_high": 0.2, "select_fraction": fraction, "lb": 0.05, "ub": 5.0}
    clip_cov = objective(create("clipper", "clip-cov", **params))
    ppo = objective(create("clipper", "ppo", eps_low=0.2, eps_high=0.2))
    _, metrics, grad = loss_and_grad(clip_cov, logp, old, adv, mask, seed=seed)
    _, ppo_metrics, ppo_grad = loss_and_grad(ppo, logp, old, adv, mask)
    assert metrics["clip/fraction"] == ppo_metrics["clip/fraction"]
    keep = mask > 0
    a_c = adv - adv[keep].mean()
    l_c = logp - logp[keep].mean()
    cov = a_c * l_c
    r = torch.exp(logp - old)
    near = (
        ((cov - 0.05).abs() < 1e-9) | ((cov - 5.0).abs() < 1e-9) | ((r - 1.2).abs() < 1e-9) | ((r - 0.8).abs() < 1e-9)
    )
    if (near & keep).any():  # on a boundary the test's rounding may differ from the component's
        return
    unclipped = ~(((adv > 0) & (r > 1.2)) | ((adv < 0) & (r < 0.8)))
    detached = keep & (grad == 0) & (ppo_grad != 0)
    # a token that lost its gradient was a candidate: unclipped with lb < c < ub
    assert (unclipped[detached] & (cov[detached] > 0.05) & (cov[detached] < 5.0)).all()
    candidates = keep & unclipped & (cov > 0.05) & (cov < 5.0)
    n = int(keep.sum().item())
    expected = min(max(1, int(n * fraction)), int(candidates.sum().item()))
    assert metrics["clip/cov_fraction"] == pytest.approx(expected / n)
    # everything else keeps PPO's gradient exactly
    torch.testing.assert_close(grad[keep & ~detached], ppo_grad[keep & ~detached], rtol=0, atol=1e-12)
