"""The default router policy: no replay."""

from __future__ import annotations

import rlzoo
from rlzoo.interfaces import RecordedRouting, RouterPolicy


@rlzoo.register("router", "none")
class NoReplay(RouterPolicy):
    """No routing replay: every forward pass routes afresh with the current router.

    The experts chosen for a token may change after each gradient step (an expert "flip"), so the policy whose
    log-probs enter the ratio is not exactly the one that produced ``old`` (GSPO paper: ~10% flips per step on a
    48-layer MoE). Dense models need nothing else; for MoE models the loop still reports ``moe/flip_rate``.
    """

    source = "none"

    def replays_routing(self) -> bool:
        return False

    def old_pass_routing(self, recorded: RecordedRouting) -> None:
        return None

    def update_routing(self, recorded: RecordedRouting) -> None:
        return None
