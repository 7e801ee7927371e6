"""Entropy bonus: reward a spread-out next-token distribution to keep exploring.

    L_reg = -coef * aggregate(H_t),     H_t = -sum_v pi(v | context_t) log pi(v | context_t)

``H_t`` is the entropy of the full distribution at each response position (computed by the training engine,
with gradient), reduced by the configured aggregation like the policy loss (verl: ``actor.entropy_coeff``).
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import LossAggregation, Params, Regulariser


@rlzoo.register("regulariser", "entropy")
class EntropyBonus(Regulariser):
    """Entropy regulariser: adds -coef * aggregate(H_t) to the loss."""

    needs_entropy = True
    formula = "-coef * aggregate(H_t)"
    reference = "entropy regularisation (Williams & Peng 1991; PPO, Schulman et al. 2017)"
    verl_name = "actor.entropy_coeff"
    trl_name = ""

    class Params(Params):
        coef: float = Field(0.001, ge=0.0, description="weight of the entropy bonus")

    def loss(
        self, logp: torch.Tensor, entropy: torch.Tensor | None, mask: torch.Tensor, aggregation: LossAggregation
    ) -> torch.Tensor:
        if entropy is None:
            raise ValueError("the entropy regulariser needs the per-token entropy (needs_entropy is set)")
        return -self.params.coef * aggregation.aggregate(entropy, mask)
