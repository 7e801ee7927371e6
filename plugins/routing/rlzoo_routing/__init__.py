"""First-party router policies for MoE models (the ``router:`` section of an algorithm).

- ``none``: route afresh in every update forward pass.
- ``replay-old``: Routing Replay (R2), experts from the training engine's old-log-prob pass.
- ``replay-rollout``: Rollout Routing Replay (R3), experts from the rollout engine.

The mechanics (hooks on the model's routers) live in the core, ``rlzoo.moe``; these classes only choose the source.
"""

from rlzoo_routing.no_replay import NoReplay
from rlzoo_routing.replay_old import ReplayOld
from rlzoo_routing.replay_rollout import ReplayRollout

__all__ = ["NoReplay", "ReplayOld", "ReplayRollout"]
