"""Fixed KL-in-reward coefficient: every token's reward is penalised with the same ``beta`` throughout the run.

    r_t <- r_t - coef * KL_t

As verl's ``FixedKLController`` (``algorithm.kl_ctrl.type=fixed``, ``kl_coef``); ``update`` does nothing.
"""

from __future__ import annotations

from pydantic import Field

import rlzoo
from rlzoo.interfaces import KLController, Params


@rlzoo.register("kl_controller", "fixed")
class FixedKLController(KLController):
    """Fixed KL-in-reward coefficient: beta = coef at every step.

    ``r_t <- r_t - coef * KL_t``.
    """

    formula = "beta = coef (constant)"
    reference = "KL penalty in the reward (Ziegler et al. 2019, arXiv:1909.08593; Ouyang et al. 2022)"
    verl_name = "algorithm.kl_ctrl.type=fixed"

    class Params(Params):
        coef: float = Field(0.001, ge=0.0, description="the KL coefficient beta (verl's kl_ctrl.kl_coef)")

    @property
    def coef(self) -> float:
        return self.params.coef
