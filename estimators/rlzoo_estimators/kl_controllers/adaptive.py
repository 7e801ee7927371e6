"""Adaptive KL-in-reward coefficient (Ziegler et al. 2019): beta steers the measured KL towards a target.

    e    = clip(current_kl / target - 1, -0.2, 0.2)
    beta <- beta * (1 + e * n_steps / horizon)

after each batch of ``n_steps`` responses whose mean per-response KL was ``current_kl``; ``beta`` starts at
``coef``. As verl's ``AdaptiveKLController`` (``algorithm.kl_ctrl.type=adaptive``, ``kl_coef``, ``target_kl``,
``horizon``). The current beta is the controller's state (:meth:`state_dict`), so a resumed run continues with it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

import rlzoo
from rlzoo.interfaces import KLController, Params


@rlzoo.register("kl_controller", "adaptive")
class AdaptiveKLController(KLController):
    """Adaptive KL-in-reward coefficient: beta *= 1 + clip(KL/target - 1, -0.2, 0.2) * n_steps / horizon.

    Proportional control of the KL towards ``target``; beta starts at ``coef``.
    """

    formula = "beta <- beta (1 + clip(KL / target - 1, -0.2, 0.2) n_steps / horizon)"
    reference = "Ziegler et al. 2019, Fine-Tuning LMs from Human Preferences (arXiv:1909.08593)"
    verl_name = "algorithm.kl_ctrl.type=adaptive"

    class Params(Params):
        coef: float = Field(0.001, ge=0.0, description="the initial KL coefficient beta (verl's kl_ctrl.kl_coef)")
        target: float = Field(0.1, gt=0.0, description="the KL per response beta steers towards (verl's target_kl)")
        horizon: int = Field(
            10000, gt=0, description="responses over which a full 20% correction of beta accrues (verl's horizon)"
        )

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        self._coef = float(self.params.coef)

    @property
    def coef(self) -> float:
        return self._coef

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.params.target - 1.0, -0.2), 0.2)
        self._coef *= 1.0 + error * n_steps / self.params.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self._coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._coef = float(state["coef"])
