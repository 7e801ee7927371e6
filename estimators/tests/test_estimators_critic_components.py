"""The critic's components: the gae advantage source, the clipped / unclipped value losses, the fixed / adaptive
KL-in-reward controllers (their numbers against verl are in test_estimators_reference.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from estimators_testlib import REGISTRY, create, floats, right_padded_mask, t, tensor_of
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlzoo.errors import ConfigError
from rlzoo.interfaces import RewardBatch

# ---------------------------------------------------------------------------------------------------------------
# gae


@st.composite
def episodes(draw, max_rows: int = 4, max_tokens: int = 8):
    """(token_rewards, values, mask): any mask pattern (holes anywhere, empty rows), junk at masked positions."""
    rows, width = draw(st.integers(1, max_rows)), draw(st.integers(1, max_tokens))
    mask = tensor_of(draw, (rows, width), st.sampled_from([0.0, 1.0]))
    rewards = tensor_of(draw, (rows, width), floats(-3.0, 3.0))
    values = tensor_of(draw, (rows, width), floats(-3.0, 3.0))
    junk = draw(st.sampled_from([math.nan, math.inf, 1e6]))
    keep = mask > 0
    return torch.where(keep, rewards, junk), torch.where(keep, values, -junk), mask


def gae_batch(token_rewards, values, mask) -> RewardBatch:
    rows = len(mask)
    return RewardBatch(torch.zeros(rows), torch.arange(rows), mask, token_rewards=token_rewards, values=values)


def raw_gae(token_rewards, values, mask, gamma=1.0, lam=1.0):
    return create("advantage", "gae", gamma=gamma, lam=lam, whiten=False).advantages_and_returns(
        gae_batch(token_rewards, values, mask)
    )


def recursion(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """The GAE recursion on one row of valid tokens only, written out."""
    adv, running, next_value = [0.0] * len(rewards), 0.0, 0.0
    for k in reversed(range(len(rewards))):
        running = rewards[k] + gamma * next_value - values[k] + gamma * lam * running
        adv[k], next_value = running, values[k]
    return adv


@settings(max_examples=150, deadline=None)
@given(episodes(), floats(0.0, 1.0), floats(0.0, 1.0))
def test_gae_is_the_recursion_over_each_rows_valid_tokens(episode, gamma, lam):
    rewards, values, mask = episode
    adv, returns = raw_gae(rewards, values, mask, gamma, lam)
    for i, row in enumerate(mask > 0):
        expected = recursion(rewards[i][row].tolist(), values[i][row].tolist(), gamma, lam)
        torch.testing.assert_close(adv[i][row], t(expected), rtol=0, atol=1e-9)
        torch.testing.assert_close(returns[i][row], t(expected) + values[i][row], rtol=0, atol=1e-9)
    assert (adv[mask == 0] == 0).all() and (returns[mask == 0] == 0).all()


@settings(max_examples=100, deadline=None)
@given(episodes())
def test_gae_lam_one_gamma_one_zero_values_is_the_sum_of_later_rewards(episode):
    rewards, values, mask = episode
    keep = mask > 0
    adv, returns = raw_gae(rewards, torch.where(keep, 0.0, values), mask)
    later = torch.where(keep, rewards, 0.0).flip(-1).cumsum(-1).flip(-1)  # rewards at t and after, valid only
    torch.testing.assert_close(adv, torch.where(keep, later, 0.0), rtol=0, atol=1e-9)
    torch.testing.assert_close(returns, adv, rtol=0, atol=0)


@settings(max_examples=100, deadline=None)
@given(episodes(), floats(0.0, 1.0))
def test_gae_lam_zero_is_the_one_step_td_error_to_the_next_valid_token(episode, gamma):
    rewards, values, mask = episode
    adv, _ = raw_gae(rewards, values, mask, gamma, 0.0)
    for i in range(len(mask)):
        valid = (mask[i] > 0).nonzero().flatten().tolist()
        for k, pos in enumerate(valid):
            next_value = values[i, valid[k + 1]].item() if k + 1 < len(valid) else 0.0
            td = rewards[i, pos].item() + gamma * next_value - values[i, pos].item()
            assert adv[i, pos].item() == pytest.approx(td, abs=1e-9)


def compact(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's valid entries moved to its front, in order, right-padded with 0; and the matching mask."""
    out, out_mask = torch.zeros_like(x), torch.zeros_like(mask)
    for i, row in enumerate(mask > 0):
        n = int(row.sum())
        out[i, :n], out_mask[i, :n] = x[i][row], 1.0
    return out, out_mask


@settings(max_examples=100, deadline=None)
@given(episodes(), floats(0.0, 1.0), floats(0.0, 1.0), st.booleans())
def test_gae_holes_give_the_compacted_sequences_result(episode, gamma, lam, whiten):
    # remove the masked columns of every row, compute on the right-padded result, put the numbers back: the same
    rewards, values, mask = episode
    source = create("advantage", "gae", gamma=gamma, lam=lam, whiten=whiten)
    adv, returns = source.advantages_and_returns(gae_batch(rewards, values, mask))
    (c_rewards, c_mask), (c_values, _) = compact(rewards, mask), compact(values, mask)
    c_adv, c_returns = source.advantages_and_returns(gae_batch(c_rewards, c_values, c_mask))
    for i, row in enumerate(mask > 0):
        n = int(row.sum())
        torch.testing.assert_close(adv[i][row], c_adv[i, :n], rtol=0, atol=1e-9)
        torch.testing.assert_close(returns[i][row], c_returns[i, :n], rtol=0, atol=1e-9)


def test_gae_skips_a_hole_hand_values():
    # row: policy token, observation token (reward 5, value 9: ignored), policy token with reward 1
    mask = t([[1.0, 0.0, 1.0]])
    rewards, values = t([[0.0, 5.0, 1.0]]), t([[0.5, 9.0, 0.25]])
    adv, returns = raw_gae(rewards, values, mask, gamma=0.5, lam=0.5)
    last = 1.0 - 0.25  # r + gamma * 0 - V
    first = 0.0 + 0.5 * 0.25 - 0.5 + 0.25 * last  # r + gamma V_next - V + gamma lam A_next
    torch.testing.assert_close(adv, t([[first, 0.0, last]]), rtol=0, atol=1e-12)
    torch.testing.assert_close(returns, t([[first + 0.5, 0.0, last + 0.25]]), rtol=0, atol=1e-12)


def test_gae_whitens_over_the_batchs_valid_tokens_and_compute_gives_the_advantages():
    rewards, values = t([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]), t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    mask = right_padded_mask([2, 1], 3)
    batch = gae_batch(rewards, values, mask)
    raw, _ = raw_gae(rewards, values, mask)
    whitened, returns = create("advantage", "gae").advantages_and_returns(batch)
    valid = raw[mask > 0]
    expected = (valid - valid.mean()) / torch.sqrt(valid.var(unbiased=True) + 1e-8)
    torch.testing.assert_close(whitened[mask > 0], expected, rtol=0, atol=1e-12)
    assert (whitened[mask == 0] == 0).all()
    torch.testing.assert_close(returns, raw + values * mask, rtol=0, atol=1e-12)
    torch.testing.assert_close(create("advantage", "gae").compute(batch), whitened, rtol=0, atol=0)


@pytest.mark.parametrize("lengths", [[0, 0], [1, 0]], ids=["no-valid-token", "one-valid-token"])
def test_gae_whitening_fewer_than_two_valid_tokens_gives_zero_advantages(lengths):
    # verl's masked_whiten raises here; a batch without spread carries no signal: 0, and the returns stay usable
    mask = right_padded_mask(lengths, 2)
    rewards, values = t([[1.0, 0.0], [0.0, 0.0]]), t([[0.25, 0.0], [0.0, 0.0]])
    adv, returns = create("advantage", "gae").advantages_and_returns(gae_batch(rewards, values, mask))
    assert torch.count_nonzero(adv) == 0
    torch.testing.assert_close(returns, t([[1.0, 0.0], [0.0, 0.0]]) * mask, rtol=0, atol=0)


def test_gae_keeps_the_dtype_and_takes_no_gradient():
    mask = right_padded_mask([2, 3], 3, dtype=torch.float32)
    values = torch.rand(2, 3, requires_grad=True)
    batch = gae_batch(torch.rand(2, 3), values, mask)
    adv, returns = create("advantage", "gae").advantages_and_returns(batch)
    assert adv.dtype == returns.dtype == torch.float32
    assert not adv.requires_grad and not returns.requires_grad


@pytest.mark.parametrize(
    ("given_fields", "missing"),
    [({"values": t([[0.0]])}, "token_rewards"), ({"token_rewards": t([[1.0]])}, "values"), ({}, "token_rewards and")],
)
def test_gae_names_what_is_missing(given_fields, missing):
    batch = RewardBatch(t([1.0]), torch.tensor([0]), t([[1.0]]), **given_fields)
    with pytest.raises(ValueError, match=f"RewardBatch.{missing}"):
        create("advantage", "gae").compute(batch)


def test_gae_declares_it_needs_values_and_validates_its_params():
    assert REGISTRY.get("advantage", "gae").cls.needs_values
    assert not REGISTRY.get("advantage", "group").cls.needs_values
    for bad in ({"gamma": 1.5}, {"lam": -0.1}, {"whiten": "maybe"}):
        with pytest.raises(ConfigError):
            create("advantage", "gae", **bad)


# ---------------------------------------------------------------------------------------------------------------
# value losses


@st.composite
def value_batches(draw, max_rows: int = 4, max_tokens: int = 6):
    rows, width = draw(st.integers(1, max_rows)), draw(st.integers(1, max_tokens))
    shape = (rows, width)
    mask = tensor_of(draw, shape, st.sampled_from([0.0, 1.0]))
    old = tensor_of(draw, shape, floats(-3.0, 3.0))
    values = tensor_of(draw, shape, floats(-3.0, 3.0))
    returns = tensor_of(draw, shape, floats(-3.0, 3.0))
    return values, old, returns, mask


@settings(max_examples=150, deadline=None)
@given(value_batches(), floats(0.0, 2.0))
def test_clipped_value_loss_is_the_formula_and_flags_the_clipped_term(batch, clip_range):
    values, old, returns, mask = batch
    result = create("value_loss", "clipped", clip_range=clip_range).loss(values, old, returns, mask)
    unclipped = (values - returns) ** 2
    v_clip = torch.minimum(torch.maximum(values, old - clip_range), old + clip_range)
    clipped = (v_clip - returns) ** 2
    keep = mask > 0
    expected = torch.where(keep, 0.5 * torch.maximum(unclipped, clipped), 0.0)
    torch.testing.assert_close(result.per_token, expected, rtol=0, atol=1e-12)
    assert torch.equal(result.clipped, (clipped > unclipped) & keep)
    # inside the clip range the clipped term is the unclipped one
    assert not result.clipped[(values - old).abs() <= clip_range].any()


@settings(max_examples=100, deadline=None)
@given(value_batches())
def test_clipped_equals_unclipped_when_the_clip_range_is_huge(batch):
    values, old, returns, mask = batch
    clipped = create("value_loss", "clipped", clip_range=1e9).loss(values, old, returns, mask)
    plain = create("value_loss", "unclipped").loss(values, old, returns, mask)
    torch.testing.assert_close(clipped.per_token, plain.per_token, rtol=0, atol=1e-12)
    assert not clipped.clipped.any() and not plain.clipped.any()
    torch.testing.assert_close(plain.per_token, 0.5 * (values - returns) ** 2 * mask, rtol=0, atol=1e-12)


def test_clipped_value_loss_uses_the_clipped_term_hand_values():
    # old 0, c 0.5, return 2: v = 3 (unclipped 1, clipped (0.5 - 2)^2 = 2.25, used); v = -1 (9 vs 6.25)
    values, old, returns, mask = t([[3.0, -1.0, 1.75]]), t([[0.0, 0.0, 1.5]]), t([[2.0, 2.0, 2.0]]), t([[1, 1, 1]])
    result = create("value_loss", "clipped").loss(values, old, returns, mask)
    torch.testing.assert_close(result.per_token, t([[0.5 * 2.25, 0.5 * 9.0, 0.5 * 0.0625]]), rtol=0, atol=1e-12)
    assert result.clipped.tolist() == [[True, False, False]]


@settings(max_examples=100, deadline=None)
@given(value_batches(), floats(0.0, 2.0))
def test_clipped_value_loss_gradient_is_zero_where_clipped(batch, clip_range):
    values, old, returns, mask = batch
    unclipped = (values - returns) ** 2
    v_clip = values.clamp(min=old - clip_range, max=old + clip_range)
    # no tie between the terms where they differ (there the gradient would be shared between them)
    outside = v_clip != values
    assume(((unclipped - (v_clip - returns) ** 2).abs() > 1e-9)[outside].all())
    v = values.clone().requires_grad_()
    result = create("value_loss", "clipped", clip_range=clip_range).loss(v, old, returns, mask)
    result.per_token.sum().backward()
    expected = torch.where(result.clipped | (mask == 0), 0.0, values - returns)
    torch.testing.assert_close(v.grad, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["clipped", "unclipped"])
@pytest.mark.parametrize("junk", [math.nan, math.inf, -math.inf])
def test_value_loss_padding_leaks_nothing(name, junk):
    mask = right_padded_mask([2, 1], 3)
    keep = mask > 0
    values = torch.where(keep, t([[0.5, 1.0, 0.0], [2.0, 0.0, 0.0]]), junk).requires_grad_()
    old = torch.where(keep, t([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), junk)
    returns = torch.where(keep, t([[1.0, 3.0, 0.0], [0.0, 0.0, 0.0]]), -junk)
    result = create("value_loss", name).loss(values, old, returns, mask)
    loss = create("aggregation", "token-mean").aggregate(result.per_token, mask)
    loss.backward()
    assert torch.isfinite(result.per_token).all() and (result.per_token[~keep] == 0).all()
    assert torch.isfinite(loss) and torch.isfinite(values.grad).all() and (values.grad[~keep] == 0).all()
    assert not result.clipped[~keep].any()


# ---------------------------------------------------------------------------------------------------------------
# KL controllers


def test_fixed_controller_never_changes():
    controller = create("kl_controller", "fixed", coef=0.02)
    for kl in (0.0, 5.0, 1e-3):
        controller.update(kl, 1000)
    assert controller.coef == 0.02
    assert create("kl_controller", "fixed").coef == 0.001


@pytest.mark.parametrize(
    ("current_kl", "factor"),
    [(0.1, 1.0), (0.11, 1.0 + 0.1 * 0.5), (10.0, 1.0 + 0.2 * 0.5), (0.0, 1.0 - 0.2 * 0.5), (0.09, 1.0 - 0.1 * 0.5)],
)
def test_adaptive_controller_proportional_step(current_kl, factor):
    # target 0.1, n_steps / horizon = 0.5: the error is clipped to [-0.2, 0.2]
    controller = create("kl_controller", "adaptive", coef=0.01, target=0.1, horizon=200)
    controller.update(current_kl, 100)
    assert controller.coef == pytest.approx(0.01 * factor, rel=1e-12)


def test_adaptive_controller_state_round_trips():
    params = {"coef": 0.004, "target": 0.05, "horizon": 1000}
    updates = [(0.2, 64), (0.01, 64), (0.07, 128), (0.03, 32)]
    controller = create("kl_controller", "adaptive", **params)
    for kl, n in updates:
        controller.update(kl, n)
    state = json.loads(json.dumps(controller.state_dict()))  # saved with a checkpoint
    resumed, fresh = create("kl_controller", "adaptive", **params), create("kl_controller", "adaptive", **params)
    resumed.load_state_dict(state)
    assert resumed.coef == controller.coef != fresh.coef
    for kl, n in updates:
        controller.update(kl, n)
        resumed.update(kl, n)
        assert resumed.coef == controller.coef


@pytest.mark.parametrize("bad", [{"target": 0.0}, {"horizon": 0}, {"coef": -1.0}])
def test_adaptive_controller_validates_its_params(bad):
    with pytest.raises(ConfigError):
        create("kl_controller", "adaptive", **bad)
