"""Third-party clippers through the public API: one written the old way (``clip`` only) keeps working unchanged,
and one that needs the whole batch (``clip_batch``) can be written with nothing but ``rlzoo.interfaces``."""

from __future__ import annotations

import pytest
import torch
from estimators_testlib import t

import rlzoo
import rlzoo_estimators.plugin
from rlzoo.interfaces import Clipper, ClipResult, Params, PolicyBatch
from rlzoo.registry import Registry


class OldStyleClipper(Clipper):
    """A clipper written before clip_batch existed: per-token clip(), a three-field ClipResult."""

    name = "old-style"

    class Params(Params):
        eps: float = 0.2

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        clipped = ratio.clamp(1 - self.params.eps, 1 + self.params.eps)
        loss = -torch.minimum(ratio * advantages, clipped * advantages)
        r = ratio.detach()
        eps = self.params.eps
        return ClipResult(loss, (advantages < 0) & (r < 1 - eps), (advantages > 0) & (r > 1 + eps))


class BatchMeanBaselineClipper(Clipper):
    """A batch-level loss a third party might write: -rho * (A - mean of A over the valid tokens of the batch).

    It also draws one random token per call from the seeded generator and reports it, to show the seed arrives.
    """

    name = "batch-baseline"

    def clip_batch(self, batch: PolicyBatch) -> ClipResult:
        keep = batch.mask > 0
        baseline = batch.advantages[keep].mean() if keep.any() else torch.zeros(())
        never = torch.zeros_like(keep)
        draw = torch.randint(0, 1_000_000, (1,), generator=batch.generator).item()
        loss = -batch.ratio * (batch.advantages - baseline)
        return ClipResult(loss, never, never.clone(), metrics={"thirdparty/draw": float(draw)})


class ThirdPartyPlugin:
    @rlzoo.hookimpl
    def rlzoo_clippers(self) -> list[type]:
        return [OldStyleClipper, BatchMeanBaselineClipper]


@pytest.fixture(scope="module")
def registry() -> Registry:
    registry = Registry()
    registry.add_plugin(rlzoo_estimators.plugin, name="estimators", distribution="rlzoo-estimators")
    registry.add_plugin(ThirdPartyPlugin(), name="thirdparty", distribution="thirdparty")
    assert registry.load_errors == []
    return registry


LOGP = [[-1.0, -0.5, -2.0, 0.0], [-0.3, -1.2, 0.0, 0.0]]
OLD = [[-1.3, -0.5, -1.7, 0.0], [-0.3, -0.9, 0.0, 0.0]]
ADV = [[1.0, 1.0, 1.0, 0.0], [-1.0, -1.0, 0.0, 0.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 0]]


def run(objective, **kwargs):
    logp = t(LOGP).requires_grad_()
    loss, metrics = objective(logp, t(OLD), t(ADV), t(MASK), **kwargs)
    loss.backward()
    return loss.item(), metrics, logp.grad


def test_old_style_clipper_works_unchanged_and_equals_ppo(registry):
    old = rlzoo.build_objective({"preset": "dapo", "clipper": {"name": "old-style", "eps": 0.2}}, registry=registry)
    ppo = rlzoo.build_objective({"preset": "dapo", "clipper": {"name": "ppo", "eps_high": 0.2}}, registry=registry)
    loss_a, metrics_a, grad_a = run(old)
    loss_b, metrics_b, grad_b = run(ppo)
    assert loss_a == loss_b and torch.equal(grad_a, grad_b)
    assert metrics_a == metrics_b
    assert metrics_a["clip/fraction"] > 0  # the example clips something


def test_batch_level_third_party_clipper_sees_the_whole_batch_and_the_seed(registry):
    objective = rlzoo.build_objective({"preset": "dapo", "clipper": {"name": "batch-baseline"}}, registry=registry)
    loss, metrics, grad = run(objective, seed=7)
    mask, adv = t(MASK), t(ADV)
    baseline = adv[mask > 0].mean()
    ratio = torch.exp((t(LOGP) - t(OLD)) * mask)
    expected = (-(ratio * (adv - baseline)) * mask).sum() / mask.sum()
    assert loss == pytest.approx(expected.item())
    assert metrics["thirdparty/draw"] == run(objective, seed=7)[1]["thirdparty/draw"]
    assert metrics["thirdparty/draw"] != run(objective, seed=8)[1]["thirdparty/draw"]


def test_a_clipper_implementing_neither_method_says_so():
    class Empty(Clipper):
        name = "empty"

    with pytest.raises(NotImplementedError, match="clip_batch"):
        Empty().clip(t([[1.0]]), t([[1.0]]))
