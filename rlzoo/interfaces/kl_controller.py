"""KL-in-reward controllers: the coefficient of the reference KL subtracted from each token's reward.

With ``algorithm.kl_in_reward`` set, the core computes the per-token KL of the behaviour policy to the reference
with the configured KL estimator (``algorithm.kl``, on the old log-probs), subtracts ``coef * KL_t`` from every
response token's reward before advantages (verl's ``apply_kl_penalty`` under ``use_kl_in_reward``), then calls
``update(current_kl, n_steps)`` with the batch's mean per-response KL and its number of responses. The core logs
``kl/coef`` (the coefficient the batch was penalised with) and ``kl/in_reward`` (``current_kl``).

A controller that changes its coefficient keeps it in :meth:`state_dict`, saved with every checkpoint, so a
resumed run continues with the coefficient it had.
"""

from __future__ import annotations

from typing import Any

from rlzoo.interfaces.base import Component


class KLController(Component):
    """``coef`` (the current coefficient) and ``update(current_kl, n_steps)`` after each batch."""

    kind = "kl_controller"
    metric_namespace = "kl"

    @property
    def coef(self) -> float:
        raise NotImplementedError

    def update(self, current_kl: float, n_steps: int) -> None:
        """After a batch of ``n_steps`` responses whose mean per-response KL was ``current_kl``."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue exactly (JSON-serialisable)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
