"""Routing Replay (R2)."""

from __future__ import annotations

from rlzoo.interfaces import RouterPolicy


class ReplayOld(RouterPolicy):
    """Routing Replay (R2): replay the experts of the training engine's old-log-prob pass in every update pass.

    The loop records each token's top-k experts per MoE layer while computing ``old`` log-probs, then replays
    them (the minibatch's rows) in every policy-update forward pass. The gate weights are the current router's
    softmax gathered at the replayed experts and renormalised as the model does, so the router keeps learning;
    only the choice of experts is frozen for the rollout batch. Removes expert flips between ``old`` and the
    updated policy; does not address the rollout-vs-training mismatch (see ``replay-rollout``).
    """

    name = "replay-old"
    source = "old"
