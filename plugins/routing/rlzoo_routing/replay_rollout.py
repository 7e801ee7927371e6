"""Rollout Routing Replay (R3, arXiv:2510.11370)."""

from __future__ import annotations

import rlzoo
from rlzoo.interfaces import RecordedRouting, RouterPolicy


@rlzoo.register("router", "replay-rollout")
class ReplayRollout(RouterPolicy):
    """Rollout Routing Replay (R3): replay the experts the rollout engine used while sampling.

    The rollout engine returns each generation's experts (``Generation.routing``, ``[prompt + response - 1,
    layers, top_k]``); the loop aligns them with the training batch and this policy replays them in the
    old-log-prob pass and in every update pass (gate weights from the current router, so it still gets
    gradient). This removes the routing part of the training-inference mismatch as well as flips across
    gradient steps. Needs a rollout engine that records routing (``hf`` or ``vllm``); the last sampled token
    and the padding have no record and are routed afresh, which changes no response log-prob.
    """

    source = "rollout"

    def needs_rollout_routing(self) -> bool:
        return True

    def replays_routing(self) -> bool:
        return True

    def old_pass_routing(self, recorded: RecordedRouting):
        return recorded.rollout

    def update_routing(self, recorded: RecordedRouting):
        return recorded.rollout
