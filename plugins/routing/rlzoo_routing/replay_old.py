"""Routing Replay (R2)."""

from __future__ import annotations

import rlzoo
from rlzoo.interfaces import RecordedRouting, RouterPolicy


@rlzoo.register("router", "replay-old")
class ReplayOld(RouterPolicy):
    """Routing Replay (R2): replay the experts of the training engine's old-log-prob pass in every update pass.

    The old-log-prob pass routes afresh and its top-k experts per token and MoE layer are recorded; every
    policy-update forward pass replays them (the minibatch's rows). The gate weights are the current router's
    softmax gathered at the replayed experts and renormalised as the model does, so the router keeps learning;
    only the choice of experts is frozen for the rollout batch. Removes expert flips between ``old`` and the
    updated policy; does not address the rollout-vs-training mismatch (see ``replay-rollout``).
    Reference: GSPO (arXiv:2507.18071), section on MoE training.
    """

    source = "old"

    def replays_routing(self) -> bool:
        return True

    def old_pass_routing(self, recorded: RecordedRouting) -> None:
        return None

    def update_routing(self, recorded: RecordedRouting):
        return recorded.old
