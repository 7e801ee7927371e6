"""The composed policy-gradient objective: ratio x clipper x aggregation (+ kl_coef * KL to a reference).

    log_w   = clamp(ratio.log_ratio(logp, old_logp, mask), -c, c)
    w       = exp(log_w)
    L_tok   = clipper.clip_batch(PolicyBatch(w, log_w, A, mask, logp, old_logp, rng)).loss * weights
              (per-token clippers only implement clip(w, A), which clip_batch calls by default)
    loss    = aggregation.aggregate(L_tok, mask) + kl_coef * aggregation.aggregate(kl.estimate(logp, ref_logp), mask)
              (kl_bias_correction: the KL term's tokens times w, with w's gradient; TRL's use_bias_correction_kl)
              + sum_k regulariser_k.loss(logp, H, mask, aggregation)      (e.g. entropy: -coef * aggregate(H_t))

``objective(...)`` works on plain tensors, so it can be dropped into any training loop::

    objective = rlzoo.build_objective({"preset": "gspo"})
    loss, metrics = objective(logp, old_logp, advantages, mask)
    loss.backward()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rlzoo.config.algorithm import AlgorithmConfig
from rlzoo.config.presets import expand_preset
from rlzoo.errors import ConfigError
from rlzoo.interfaces import (
    Clipper,
    ClipResult,
    KLEstimator,
    LossAggregation,
    PolicyBatch,
    RatioEstimator,
    Regulariser,
)
from rlzoo.interfaces.base import collecting
from rlzoo.registry import Registry, default_registry, format_validation_error
from rlzoo.util.reductions import Deferred, Max, Min, read_metrics
from rlzoo.util.tensors import masked_mean


def k3_from_samples_of_old(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(old || new) at tokens sampled from the old policy: r - 1 - log r, r = new/old."""
    log_r = logp - old_logp
    return torch.exp(log_r) - 1.0 - log_r


@dataclass
class Objective:
    ratio: RatioEstimator
    clipper: Clipper
    aggregation: LossAggregation
    kl: KLEstimator
    # the defaults are the config's (rlzoo.config.algorithm.AlgorithmConfig), defined there once
    kl_coef: float = AlgorithmConfig.model_fields["kl_coef"].default
    log_ratio_clamp: float = AlgorithmConfig.model_fields["log_ratio_clamp"].default
    kl_bias_correction: bool = AlgorithmConfig.model_fields["kl_bias_correction"].default
    regularisers: list[Regulariser] = field(default_factory=list)

    @property
    def needs_entropy(self) -> bool:
        """A regulariser needs the per-token entropy ``H`` (pass ``entropy=`` then)."""
        return any(r.needs_entropy for r in self.regularisers)

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        ref_logp: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        seed: int | None = None,
        entropy: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """:meth:`on_device` with the metrics read as floats (one host transfer): for a loop of one's own."""
        loss, metrics = self.on_device(logp, old_logp, advantages, mask, ref_logp, weights, seed, entropy)
        return loss, read_metrics([metrics])[0]

    def on_device(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        ref_logp: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        seed: int | None = None,
        entropy: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Loss to minimise and its metrics. All tensors are ``[batch, tokens]``, on the device of ``logp``;
        ``mask`` is 1 on response tokens. The built-in metrics stay on that device, 0-dim tensors (declared ones as
        :class:`~rlzoo.util.reductions.Deferred`): nothing here waits for the device, and a step reads every
        minibatch's metrics at once (:func:`~rlzoo.util.reductions.reduce_minibatches`).

        The metrics include what the ratio estimator, clipper, aggregation, KL estimator and regularisers
        reported during the call (``Component.report``, keyed ``<namespace>/<name>/<metric>``) and the clipper's
        ``ClipResult.metrics`` as they are; each value's class declares how a step combines its minibatches'
        values (:mod:`rlzoo.util.reductions`).

        ``weights`` (optional, no gradient) multiply the per-token loss, e.g. truncated importance-sampling
        corrections for a training-inference mismatch. ``seed`` seeds the generator handed to the clipper for
        its random choices (Clip-Cov's draw); a training loop passes one derived from the run's seed, the step and
        the minibatch, so that draws differ between updates and a run is reproducible. Without it the seed is 0:
        the same inputs always give the same loss. ``entropy`` (``[batch, tokens]``, with gradient) is the
        per-token entropy of the full distribution, needed when :attr:`needs_entropy`.
        """
        self._check(logp, old_logp, advantages, mask, ref_logp, entropy)
        with collecting() as reports:  # what the components report()ed during this minibatch's calls
            loss, metrics = self._loss(logp, old_logp, advantages, mask, ref_logp, weights, seed, entropy)
        metrics.update(reports)
        return loss, metrics

    def _loss(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        ref_logp: torch.Tensor | None,
        weights: torch.Tensor | None,
        seed: int | None,
        entropy: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        b = _Masked.of(mask.to(logp.dtype), logp, old_logp, advantages, ref_logp, entropy)
        log_w = self.ratio.log_ratio(b.logp, b.old_logp, b.mask).clamp(-self.log_ratio_clamp, self.log_ratio_clamp)
        generator = torch.Generator(device=logp.device).manual_seed(seed if seed is not None else 0)
        clipped = self.clipper.clip_batch(
            PolicyBatch(torch.exp(log_w), log_w, b.advantages, b.mask, b.logp, b.old_logp, generator)
        )
        per_token = clipped.loss if weights is None else clipped.loss * weights.detach()
        policy_loss = loss = b.aggregate(per_token, self.aggregation)
        metrics: dict[str, Any] = {}
        if b.ref_logp is not None:
            kl = self.kl.estimate(b.logp, b.ref_logp)
            metrics["kl/ref"] = masked_mean(kl.detach(), b.mask)
            if self.kl_coef:
                # the k3 KL is unbiased at samples of the current policy; the batch was sampled by the old one, so
                # weighting each token by w (not detached) makes the term's gradient the KL's (DeepSeek-V3.2)
                kl_loss = b.aggregate(kl * torch.exp(log_w) if self.kl_bias_correction else kl, self.aggregation)
                metrics["loss/kl"] = kl_loss.detach()
                loss = loss + self.kl_coef * kl_loss
        for regulariser in self.regularisers:
            term = regulariser.loss(b.logp, b.entropy, b.mask, self.aggregation)
            metrics[f"loss/{regulariser.name}"] = term.detach()
            loss = loss + term
        metrics.update(_policy_metrics(policy_loss, loss, torch.exp(log_w), clipped, b))
        return loss, metrics

    def _check(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        ref_logp: torch.Tensor | None,
        entropy: torch.Tensor | None,
    ) -> None:
        if not (logp.shape == old_logp.shape == advantages.shape == mask.shape):
            raise ValueError(
                f"shape mismatch: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, "
                f"advantages {tuple(advantages.shape)}, mask {tuple(mask.shape)}"
            )
        if self.kl_coef > 0 and ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (the reference policy's log-probs of the same tokens)")
        if self.needs_entropy and entropy is None:
            raise ValueError("a regulariser needs the per-token entropy: pass entropy=[batch, tokens]")


@dataclass
class _Masked:
    """The objective's inputs with every padded position zeroed (padding may hold anything, -inf or NaN, and must
    reach neither values nor gradients); the old / reference log-probs and advantages detached."""

    mask: torch.Tensor
    keep: torch.Tensor
    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    ref_logp: torch.Tensor | None
    entropy: torch.Tensor | None

    @classmethod
    def of(
        cls,
        mask: torch.Tensor,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        ref_logp: torch.Tensor | None,
        entropy: torch.Tensor | None,
    ) -> _Masked:
        keep = mask > 0
        zero = torch.zeros_like(logp)

        def zeroed(values: torch.Tensor, detach: bool) -> torch.Tensor:
            return torch.where(keep, values.detach() if detach else values, zero)

        return cls(
            mask,
            keep,
            zeroed(logp, False),
            zeroed(old_logp, True),
            zeroed(advantages, True),
            None if ref_logp is None else zeroed(ref_logp, True),
            None if entropy is None else zeroed(entropy, False),
        )

    def aggregate(self, per_token: torch.Tensor, aggregation: LossAggregation) -> torch.Tensor:
        return aggregation.aggregate(torch.where(self.keep, per_token, torch.zeros_like(per_token)), self.mask)


@torch.no_grad()
def _policy_metrics(
    policy_loss: torch.Tensor, loss: torch.Tensor, ratio: torch.Tensor, clipped: ClipResult, b: _Masked
) -> dict[str, Any]:
    low = (clipped.clipped_low & b.keep).to(b.logp.dtype)
    high = (clipped.clipped_high & b.keep).to(b.logp.dtype)
    # the kept ratios' own mean (a masked sum would add its zeros in another order and change the float32 value);
    # on a GPU their count is the one wait on the device here
    r = ratio.detach()[b.keep]
    one = torch.ones((), dtype=r.dtype, device=r.device)
    return {
        "loss/policy": policy_loss.detach(),
        "loss/total": loss.detach(),
        "clip/low_fraction": masked_mean(low, b.mask),
        "clip/high_fraction": masked_mean(high, b.mask),
        "clip/fraction": masked_mean(torch.clamp(low + high, max=1.0), b.mask),
        "ratio/mean": r.mean() if r.numel() else one,
        "ratio/min": Deferred(r.min() if r.numel() else one, Min),
        "ratio/max": Deferred(r.max() if r.numel() else one, Max),
        "kl/old_approx": masked_mean(k3_from_samples_of_old(b.logp.detach(), b.old_logp), b.mask),
        **clipped.metrics,
    }


def build_objective(algorithm: AlgorithmConfig | Mapping[str, Any], registry: Registry | None = None) -> Objective:
    """Compose the objective of an algorithm config (a model, or a plain dict such as ``{"preset": "gspo"}``)."""
    registry = registry or default_registry()
    if not isinstance(algorithm, AlgorithmConfig):
        try:
            algorithm = AlgorithmConfig.model_validate(expand_preset(dict(algorithm)))
        except Exception as err:
            from pydantic import ValidationError

            if isinstance(err, ValidationError):
                raise ConfigError(format_validation_error(err, "algorithm")) from None
            raise

    def make(kind: str, field: str) -> Any:
        spec = getattr(algorithm, field)
        return registry.create(kind, spec.name, spec.params, loc=f"algorithm.{field}")

    return Objective(
        ratio=make("ratio", "ratio"),
        clipper=make("clipper", "clipper"),
        aggregation=make("aggregation", "aggregation"),
        kl=make("kl", "kl"),
        kl_coef=algorithm.kl_coef,
        kl_bias_correction=algorithm.kl_bias_correction,
        log_ratio_clamp=algorithm.log_ratio_clamp,
        regularisers=[
            registry.create("regulariser", spec.name, spec.params, loc=f"algorithm.regularisers.{i}")
            for i, spec in enumerate(algorithm.regularisers)
        ],
    )
