"""The composed policy-gradient objective: ratio x clipper x aggregation (+ kl_coef * KL to a reference).

    log_w   = clamp(ratio.log_ratio(logp, old_logp, mask), -c, c)
    w       = exp(log_w)
    L_tok   = clipper.clip_batch(PolicyBatch(w, log_w, A, mask, logp, old_logp, rng)).loss * weights
              (per-token clippers only implement clip(w, A), which clip_batch calls by default)
    loss    = aggregation.aggregate(L_tok, mask) + kl_coef * aggregation.aggregate(kl.estimate(logp, ref_logp), mask)
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

from rlzoo.config import AlgorithmConfig
from rlzoo.errors import ConfigError
from rlzoo.interfaces import Clipper, KLEstimator, LossAggregation, PolicyBatch, RatioEstimator, Regulariser
from rlzoo.presets import expand_preset
from rlzoo.registry import Registry, default_registry, format_validation_error


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    keep = mask > 0
    # where(), not a product: a non-finite value at a padded position must not turn the mean into NaN
    return torch.where(keep, values, torch.zeros_like(values)).sum() / keep.sum().clamp(min=1)


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
    # the defaults are the config's (rlzoo.config.AlgorithmConfig), defined there once
    kl_coef: float = AlgorithmConfig.model_fields["kl_coef"].default
    log_ratio_clamp: float = AlgorithmConfig.model_fields["log_ratio_clamp"].default
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
        """Loss to minimise and its metrics. All tensors are ``[batch, tokens]``; ``mask`` is 1 on response tokens.

        ``weights`` (optional, no gradient) multiply the per-token loss, e.g. truncated importance-sampling
        corrections for a training-inference mismatch. ``seed`` seeds the generator handed to the clipper for
        its random choices (Clip-Cov's draw); a training loop passes one derived from the run's seed, the step and
        the minibatch, so that draws differ between updates and a run is reproducible. Without it the seed is 0:
        the same inputs always give the same loss. ``entropy`` (``[batch, tokens]``, with gradient) is the
        per-token entropy of the full distribution, needed when :attr:`needs_entropy`.
        """
        if not (logp.shape == old_logp.shape == advantages.shape == mask.shape):
            raise ValueError(
                f"shape mismatch: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, "
                f"advantages {tuple(advantages.shape)}, mask {tuple(mask.shape)}"
            )
        mask = mask.to(logp.dtype)
        keep = mask > 0
        # padded positions may hold anything (-inf, NaN); zero them so neither values nor gradients see them
        zero = torch.zeros_like(logp)
        logp = torch.where(keep, logp, zero)
        old_logp = torch.where(keep, old_logp.detach(), zero)
        advantages = torch.where(keep, advantages.detach(), zero)
        if ref_logp is not None:
            ref_logp = torch.where(keep, ref_logp.detach(), zero)
        log_w = self.ratio.log_ratio(logp, old_logp, mask)
        log_w = log_w.clamp(-self.log_ratio_clamp, self.log_ratio_clamp)
        ratio = torch.exp(log_w)
        generator = torch.Generator(device=logp.device).manual_seed(seed if seed is not None else 0)
        policy_batch = PolicyBatch(ratio, log_w, advantages, mask, logp, old_logp, generator)
        clipped = self.clipper.clip_batch(policy_batch)
        per_token = clipped.loss
        metrics: dict[str, float] = {}
        if self.kl_coef > 0 and ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (the reference policy's log-probs of the same tokens)")
        if weights is not None:
            per_token = per_token * weights.detach()
        policy_loss = self.aggregation.aggregate(torch.where(keep, per_token, zero), mask)
        if ref_logp is not None:
            kl = self.kl.estimate(logp, ref_logp)
            metrics["kl/ref"] = masked_mean(kl.detach(), mask).item()
            if self.kl_coef:
                kl_loss = self.aggregation.aggregate(torch.where(keep, kl, zero), mask)
                metrics["loss/kl"] = kl_loss.item()
                loss = policy_loss + self.kl_coef * kl_loss
            else:
                loss = policy_loss
        else:
            loss = policy_loss
        if self.regularisers:
            if self.needs_entropy and entropy is None:
                raise ValueError("a regulariser needs the per-token entropy: pass entropy=[batch, tokens]")
            entropy = torch.where(keep, entropy, zero) if entropy is not None else None
            for regulariser in self.regularisers:
                term = regulariser.loss(logp, entropy, mask, self.aggregation)
                metrics[f"loss/{regulariser.name}"] = term.item()
                loss = loss + term

        with torch.no_grad():
            low = (clipped.clipped_low & keep).to(logp.dtype)
            high = (clipped.clipped_high & keep).to(logp.dtype)
            r = ratio.detach()[keep]
            metrics.update(
                {
                    "loss/policy": policy_loss.item(),
                    "loss/total": loss.item(),
                    "clip/low_fraction": masked_mean(low, mask).item(),
                    "clip/high_fraction": masked_mean(high, mask).item(),
                    "clip/fraction": masked_mean(torch.clamp(low + high, max=1.0), mask).item(),
                    "ratio/mean": r.mean().item() if r.numel() else 1.0,
                    "ratio/min": r.min().item() if r.numel() else 1.0,
                    "ratio/max": r.max().item() if r.numel() else 1.0,
                    "kl/old_approx": masked_mean(k3_from_samples_of_old(logp.detach(), old_logp), mask).item(),
                    **clipped.metrics,
                }
            )
        return loss, metrics


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
        log_ratio_clamp=algorithm.log_ratio_clamp,
        regularisers=[
            registry.create("regulariser", spec.name, spec.params, loc=f"algorithm.regularisers.{i}")
            for i, spec in enumerate(algorithm.regularisers)
        ],
    )
