"""Rejection sampling against the train-inference mismatch (verl 0.9.1's ``rollout_rs``; Liu, Li et al. 2025, "When
Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch"): tokens or whole responses
whose divergence between the two engines' distributions passes a bound leave the policy loss.

    log r_t = old_train_t - old_rollout_t                        (clamped to +-20)
    k1_t = -log r_t        k2_t = (log r_t)^2 / 2        k3_t = r_t - 1 - log r_t
        three estimates of KL(pi_rollout || pi_train) at the rollout's samples: k2, k3 >= 0, k1 signed
    statistic s, by level:
        token: k_t      seq_sum: sum_t m_t k_t      seq_mean: sum_t m_t k_t / sum_t m_t      seq_max: max_t k_t
        (a sequence statistic decides for all the response's tokens; seq_mean of k1 is minus the log of the
        geometric-mean ratio, verl's "geometric" rejection)
    keep if  s <= high                          (k2, k3)
             log(low) <= s <= log(high)         (k1; low defaults to 1/high)
    keep = the AND of every criterion in ``criteria``

The k1 bounds are verl's: they bound ``exp(s)``, a ratio pi_rollout / pi_train (the importance ratio's inverse);
symmetric bounds (the default ``low = 1/high``, and every verl preset) make the direction moot. ``seq_max`` of the
signed k1 is no divergence bound and is refused, as in verl.

A rejected token counts as padding in the policy loss: no loss, no gradient, and out of the aggregation's
denominators (:meth:`~rlzoo.interfaces.MismatchCorrection.keep`), as verl's rewritten response mask. The weights
are 1, or with ``importance`` a ``tis`` weight (verl's ``rollout_is`` beside ``rollout_rs``) on every response
token. Reports ``masked_fraction`` (share of response tokens rejected), ``seq_masked_fraction`` (share of the
responses with a rejected token), and per criterion ``<level>_<statistic>_masked_fraction`` with the statistic's
``_max`` and ``_min`` over the tokens (token level) or the responses: verl's ``rollout_rs_*`` of the same names
(verl's overall ``seq_masked_fraction`` counts empty responses too; rlzoo's counts only responses with a token).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

import rlzoo
from rlzoo.interfaces import Max, Min, MismatchCorrection, Params
from rlzoo_estimators._util import MAX_LOG_WEIGHT, masked, response_fraction, token_fraction
from rlzoo_estimators.corrections.tis import TruncatedIS, weights_of


class Criterion(Params):
    """One rejection rule: a divergence estimate, how it is pooled over a response, and its bound(s)."""

    statistic: Literal["k1", "k2", "k3"] = Field(description="k1 = -log r, k2 = (log r)^2/2, k3 = r - 1 - log r")
    level: Literal["token", "seq_sum", "seq_mean", "seq_max"] = Field(
        description="per token, or the response's sum, mean or max of the per-token estimate"
    )
    high: float = Field(gt=0.0, description="k2/k3: the largest statistic kept; k1: the ratio bound exp(s) <= high")
    low: float | None = Field(None, gt=0.0, description="k1 only: the ratio bound exp(s) >= low (null: 1/high)")

    @field_validator("level")
    @classmethod
    def _max_of_a_divergence(cls, level: str, info: ValidationInfo) -> str:
        if level == "seq_max" and info.data.get("statistic") == "k1":
            raise ValueError("seq_max needs a non-negative statistic: use k2 or k3 with it (k1 is signed)")
        return level

    @field_validator("low")
    @classmethod
    def _k1_bounds(cls, low: float | None, info: ValidationInfo) -> float | None:
        if low is None:
            return low
        if info.data.get("statistic", "k1") != "k1":
            raise ValueError("only k1 takes a lower bound (k2 and k3 are >= 0): remove it")
        high = info.data.get("high")
        if high is not None and low > high:
            raise ValueError(f"must not exceed high ({high}); got {low}")
        return low

    @property
    def option(self) -> str:
        """verl's name of the rule (``rollout_rs``): ``<level>_<statistic>``."""
        return f"{self.level}_{self.statistic}"

    def kept(self, log_r: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(``[B, T]`` which tokens pass, the statistic as compared: per token, or ``[B]`` per response)."""
        keep = mask > 0
        k = {"k1": -log_r, "k2": 0.5 * log_r.square(), "k3": torch.expm1(log_r) - log_r}[self.statistic]
        if self.level == "token":
            s = k
        elif self.level == "seq_max":
            s = masked(k, mask, fill=-math.inf).amax(dim=-1)
            s = torch.where(keep.any(dim=-1), s, torch.zeros_like(s))
        else:
            s = masked(k, mask).sum(dim=-1)
            if self.level == "seq_mean":
                s = s / keep.sum(dim=-1).clamp(min=1)
        if self.statistic == "k1":
            low = self.low if self.low is not None else 1.0 / self.high
            passed = (s >= math.log(low)) & (s <= math.log(self.high))
        else:
            passed = s <= self.high
        return (passed if self.level == "token" else passed.unsqueeze(-1).expand_as(k)), s


@rlzoo.register("correction", "rejection")
class RejectionSampling(MismatchCorrection):
    """Rejection sampling: drop tokens or responses whose k1/k2/k3 mismatch statistic passes a bound (verl)."""

    formula = "keep = AND_c 1[stat_c(k(log r)) within bounds_c], stat: token|seq_sum|seq_mean|seq_max; w = 1 or tis"
    reference = "Liu, Li et al. 2025, When Speed Kills Stability (verl rollout correction)"
    verl_name = "rollout_rs=<level>_<k>[,...], rollout_rs_threshold"

    class Params(Params):
        criteria: tuple[Criterion, ...] = Field(
            (Criterion(statistic="k1", level="seq_mean", low=0.999, high=1.001),),
            description="rules a token (its response) must all pass (default: verl's geometric rejection)",
        )
        importance: TruncatedIS.Params | None = Field(
            None, description="tis parameters for importance weights on the response tokens; null: weights 1"
        )

        @field_validator("criteria")
        @classmethod
        def _some(cls, criteria: tuple[Criterion, ...]) -> tuple[Criterion, ...]:
            # checked after the items (a length bound would repeat each bad item's error as "too short")
            if not criteria:
                raise ValueError("needs at least one criterion, e.g. {statistic: k3, level: seq_mean, high: 0.01}")
            return criteria

    def weights(self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return weights_of(self, self.params.importance, old_train, old_rollout, mask)

    def keep(
        self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        log_r = masked(old_train - old_rollout, mask).clamp(-MAX_LOG_WEIGHT, MAX_LOG_WEIGHT)
        keep = torch.ones_like(mask, dtype=torch.bool)
        for criterion in self.params.criteria:
            passed, s = criterion.kept(log_r, mask)
            keep = keep & passed
            values = s[mask > 0] if criterion.level == "token" else s[(mask > 0).any(dim=-1)]
            self.report(f"{criterion.option}_masked_fraction", token_fraction(~passed, mask))
            if values.numel():
                self.report(f"{criterion.option}_max", Max(float(values.max())))
                self.report(f"{criterion.option}_min", Min(float(values.min())))
        self.report("masked_fraction", token_fraction(~keep, mask))
        self.report("seq_masked_fraction", response_fraction(~keep, mask))
        return keep.to(mask.dtype)
