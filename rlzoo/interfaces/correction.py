"""Train-inference mismatch corrections: per-token weights for the rollout engine's sampling distribution, and
which tokens stay in the policy loss.

The rollout engine (vLLM, bf16 kernels...) samples from a slightly different distribution than the training
engine computes. With ``old_train`` the training engine's log-probs of the sampled tokens under the old weights
and ``old_rollout`` the rollout engine's, a correction returns weights ``w`` (no gradient) that multiply the
per-token policy loss, e.g. truncated importance sampling ``w = min(exp(old_train - old_rollout), C)``; and, if it
rejects samples (verl's rejection sampling, DeepSeek-V3.2's off-policy sequence masking), which tokens it keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from rlzoo.interfaces.base import Component

if TYPE_CHECKING:
    from rlzoo.interfaces.run_facts import Problem, RunFacts


class MismatchCorrection(Component):
    """``weights(old_train, old_rollout, mask) -> [batch, tokens]`` loss multipliers (1 = no correction); ``keep(...,
    advantages)`` the tokens that stay in the policy loss (all, unless the correction rejects some)."""

    kind = "correction"
    metric_namespace = "correction"
    #: whether :meth:`weights` or :meth:`keep` depend on ``old_train``; a correction that does not allows
    #: ``algorithm.old_logprobs: rollout-only`` (no training-engine pass to compute it from)
    reads_train_logprobs: ClassVar[bool] = True

    def weights(self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def keep(
        self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        """``[batch, tokens]``: 1 where a token stays in the policy loss, 0 where the correction rejects it.

        A rejected token is treated as padding by the policy loss: it adds nothing to the loss (nor to the KL and
        regulariser terms) and leaves the aggregation's denominators, the token count and, once all its tokens are
        rejected, the response count (verl's rejection sampling rewrites the response mask the same way). The loop
        calls this once per step on the whole rollout batch, after the advantages (``[batch, tokens]``, no
        gradient) and before the minibatch updates; its :meth:`~rlzoo.interfaces.Component.report` metrics join
        the step's. Values at padding do not matter. Default: every token kept.
        """
        return torch.ones_like(mask)

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """``algorithm.old_logprobs: rollout-only`` computes no ``old_train``: only a correction that does not read it."""
        if not self.reads_train_logprobs or run.config.algorithm.old_logprobs != "rollout-only":
            return []
        usable = run.names("correction", lambda cls: not cls.reads_train_logprobs)
        return [
            (
                f"{at}.name",
                f"{self.name!r} weighs the training engine's old log-probs against the rollout's, which "
                f"algorithm.old_logprobs: rollout-only does not compute; use {', '.join(map(repr, usable))} or "
                "old_logprobs: rollout",
            )
        ]
