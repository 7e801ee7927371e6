"""Clippers: turn ratios and advantages into a per-token surrogate loss (a policy loss)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlzoo.interfaces.base import Component


@dataclass
class ClipResult:
    """Per-token outputs of a clipper, all ``[batch, tokens]``.

    loss:         the surrogate to *minimise* (the negated objective), per token.
    clipped_low:  bool, the clip removed this token's gradient because the ratio fell below the lower bound.
    clipped_high: bool, the clip removed this token's gradient because the ratio rose above the upper bound
                  (for dual clip this includes tokens held by the ``c*|A|`` bound).
    metrics:      extra scalar metrics of this clipper (e.g. ``clip/cov_fraction``), reported under these keys as
                  they are, combined over minibatches by their declared class (:mod:`rlzoo.util.reductions`). A clipper may
                  instead ``self.report(...)`` them (:meth:`Component.report`, keys ``clip/<name>/<metric>``).
    """

    loss: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class PolicyBatch:
    """Everything the objective knows about one (mini)batch, for clippers that need more than ratio and advantage.

    All tensors are ``[batch, tokens]`` and hold the whole batch the loss is computed on, with padding zeroed:

    ratio:      ``exp(log_ratio)``, the ratio estimator's ratio (carries gradient).
    log_ratio:  the ratio estimator's log-ratio after the objective's clamp (carries gradient).
    advantages: per-token advantages (no gradient).
    mask:       1 on response tokens, 0 on padding (floating dtype of ``logp``).
    logp:       the policy's log-probs of the sampled tokens (carries gradient).
    old_logp:   the behaviour policy's log-probs (no gradient).
    generator:  a ``torch.Generator`` (on ``logp``'s device) for any random choice a clipper makes, seeded by the
                objective's caller from the run's seed, step and minibatch; never torch's global generator, so a
                loss is reproducible.
    """

    ratio: torch.Tensor
    log_ratio: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    logp: torch.Tensor
    old_logp: torch.Tensor
    generator: torch.Generator


class Clipper(Component):
    """A per-token policy loss: ``clip(ratio, advantages) -> ClipResult`` on ``[batch, tokens]`` tensors.

    A clipper that needs more than one token's ratio and advantage (a sequence-level loss such as GMPO, or a
    batch statistic such as the covariance of Clip-Cov / KL-Cov) overrides ``clip_batch`` instead, which sees the
    whole :class:`PolicyBatch`. The objective always calls ``clip_batch``; its default hands ``ratio`` and
    ``advantages`` to ``clip``, so a clipper written against ``clip`` alone keeps working unchanged.
    """

    kind = "clipper"
    metric_namespace = "clip"

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        raise NotImplementedError(f"clipper {self.name!r} implements clip_batch(), not the per-token clip()")

    def clip_batch(self, batch: PolicyBatch) -> ClipResult:
        return self.clip(batch.ratio, batch.advantages)
