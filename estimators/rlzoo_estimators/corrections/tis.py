"""Truncated importance sampling for the train-inference mismatch (TIS; Yao et al. 2025, verl / TRL / NeMo-RL).

    token level:     w_t = exp(old_train_t - old_rollout_t)
    sequence level:  w_i = exp( sum_t m_t (old_train_t - old_rollout_t) )      broadcast over the response
    truncate:        w <- clamp(w, c, C)
    mask:            w <- w if c <= w <= C else 0        (drop the token / the whole response's weight)
    normalize:       w <- w / mean(w)       (over the valid tokens; sequence level: over the responses)

``C`` is ``threshold``, ``c`` is ``low`` (none by default). The log-weight is clamped to +-20 before exp (verl's
safety bound). The weights carry no gradient; they multiply the per-token policy loss.

The grid is TRL's ``vllm_importance_sampling_mode`` (``{token, sequence}_{truncate, mask}``, ``C`` its
``vllm_importance_sampling_clip_max``, ``c`` its ``vllm_importance_sampling_clip_min``) and verl 0.9.1's
``rollout_is`` with a numeric ``rollout_is_threshold`` (truncate, no ``c``; ``normalize`` is its
``rollout_is_batch_normalize``). The sequence weight is the plain product of the token ratios in both (not
GSPO's length-normalised one). Reports ``oob_fraction``, the share of response tokens whose weight lay outside
``[c, C]`` (verl's ``rollout_is_ratio_fraction_high`` at token level without ``c``), and with ``normalize`` the
divisor ``norm_factor`` (verl's ``rollout_is_batch_norm_factor``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

import rlzoo
from rlzoo.interfaces import MismatchCorrection, Params
from rlzoo_estimators._util import MAX_LOG_WEIGHT, masked, token_fraction


@rlzoo.register("correction", "tis")
class TruncatedIS(MismatchCorrection):
    """Truncated importance sampling clamp(pi_train/pi_rollout, c, C), per token or sequence; truncate or mask."""

    formula = "w = clamp(pi_train/pi_rollout, c, C) (truncate) or w * 1[c <= w <= C] (mask), per token or sequence"
    reference = "TIS (Yao et al. 2025, Your efficient RL framework secretly brings you off-policy RL training)"
    verl_name = "rollout_is=token|sequence, rollout_is_threshold=C"
    trl_name = "vllm_importance_sampling_mode={token,sequence}_{truncate,mask}"

    class Params(Params):
        level: Literal["token", "sequence"] = Field("token", description="one weight per token or per response")
        action: Literal["truncate", "mask"] = Field(
            "truncate", description="clamp weights into [c, C], or zero them outside"
        )
        threshold: float = Field(2.0, gt=0.0, description="C, the cap (truncate) or cut-off (mask)")
        low: float | None = Field(
            None, gt=0.0, description="c, the floor (truncate) or lower cut-off (mask); null: none (TRL's clip_min)"
        )
        normalize: bool = Field(False, description="divide the weights by their batch mean (verl's batch_normalize)")

        @field_validator("low")
        @classmethod
        def _below_threshold(cls, low: float | None, info: ValidationInfo) -> float | None:
            threshold = info.data.get("threshold")
            if low is not None and threshold is not None and low > threshold:
                raise ValueError(f"must not exceed threshold ({threshold}); got {low}")
            return low

    def weights(self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights, metrics = importance_weights(self.params, old_train, old_rollout, mask)
        for metric, value in metrics.items():
            self.report(metric, value)
        return weights


def importance_weights(
    p: TruncatedIS.Params, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """The TIS weights of ``p`` (no gradient, 0 at padding) and their metrics; shared with the corrections that
    weigh what they keep (``rejection``, ``opsm``)."""
    log_w = masked(old_train - old_rollout, mask)
    if p.level == "sequence":
        log_w = log_w.sum(dim=-1, keepdim=True).expand_as(log_w)
    w = torch.exp(log_w.clamp(-MAX_LOG_WEIGHT, MAX_LOG_WEIGHT)).detach()
    outside = w > p.threshold if p.low is None else (w > p.threshold) | (w < p.low)
    if p.action == "truncate":
        w = w.clamp(min=p.low, max=p.threshold)
    else:
        w = torch.where(outside, torch.zeros_like(w), w)
    w = masked(w, mask)
    metrics = {"oob_fraction": token_fraction(outside, mask)}
    if not p.normalize:
        return w, metrics
    mean = _batch_mean(w, mask, p.level)
    if mean <= 1e-8:  # every weight dropped: nothing to rescale
        return w, {**metrics, "norm_factor": 1.0}
    return w / mean, {**metrics, "norm_factor": float(mean)}


def weights_of(
    correction: MismatchCorrection,
    importance: TruncatedIS.Params | None,
    old_train: torch.Tensor,
    old_rollout: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """The weights of a correction that rejects samples and may weigh the rest: ``importance`` (``tis``
    parameters) on every response token, its metrics reported by ``correction`` as ``is_<metric>``; or 1."""
    if importance is None:
        return masked(torch.ones_like(old_train), mask)
    weights, metrics = importance_weights(importance, old_train, old_rollout, mask)
    for metric, value in metrics.items():
        correction.report(f"is_{metric}", value)
    return weights


def _batch_mean(w: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The mean weight over the valid tokens, or (sequence level) over the responses' weights."""
    keep = mask > 0
    if level == "token":
        return w.sum() / keep.sum().clamp(min=1)
    responses = keep.any(dim=-1)
    per_response = w.sum(dim=-1) / keep.sum(dim=-1).clamp(min=1)
    return per_response[responses].sum() / responses.sum().clamp(min=1)
