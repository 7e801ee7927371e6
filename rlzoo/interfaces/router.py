"""Router policies: which experts an MoE model uses in the policy-update forward passes."""

from __future__ import annotations

from typing import ClassVar, Literal

from rlzoo.interfaces.base import Component

RoutingSource = Literal["none", "old", "rollout"]


class RouterPolicy(Component):
    """Chooses the expert routing replayed in every update forward pass of one rollout batch.

    ``source`` says where the replayed top-k expert indices come from:

    - ``"none"``: no replay, each forward pass routes afresh with the current router.
    - ``"old"``: the training engine's old-log-prob pass (Routing Replay, R2).
    - ``"rollout"``: the rollout engine's sampling pass (Rollout Routing Replay, R3).

    Under replay the chosen experts are fixed, but the gate weights are the current router's softmax gathered
    at the replayed indices (renormalised as the model does), so the router still gets gradient. The core's
    MoE hooks (``rlzoo.moe``: ``record_routing``, ``replay_routing``, ``routing_for_batch``, ``flip_rate``) do the
    mechanics; a policy only decides the source and may post-process it. The first-party policies ``none``,
    ``replay-old`` and ``replay-rollout`` ship in the ``rlzoo-routing`` distribution; see docs/routing-replay.md.
    """

    kind = "router"
    source: ClassVar[RoutingSource] = "none"
