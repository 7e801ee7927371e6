"""The objective's inputs of one step, on the device its loss runs on.

The step computes the old and reference log-probs, advantages, loss mask and correction weights of the whole rollout
batch on the CPU; the training engine hands the loss the minibatch's log-probs on its own device. :class:`LossInputs`
copies the step's inputs there the first time a minibatch's loss asks (once a step, not once a minibatch; copies to
a GPU that never make the host wait), and each minibatch takes its rows from those::

    inputs = LossInputs(old.logp, advantages, loss_mask, old.reference, old.correction)
    old_logp, advantages, mask, reference, weights = inputs.rows(rows, logp.device)   # each minibatch
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlzoo.engines.device import to_device


@dataclass
class LossInputs:
    """``[B, T]`` tensors of the rollout batch: the ratio's denominator, advantages, the policy loss's mask, the
    reference's log-probs (``None`` without a reference) and the correction's weights."""

    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    reference: Tensor | None
    weights: Tensor
    _copies: dict[torch.device, LossInputs] = field(default_factory=dict, repr=False, compare=False)

    def on(self, device: torch.device) -> LossInputs:
        """These inputs on ``device``: copied at the first call for it, the same tensors afterwards."""
        if device not in self._copies:
            self._copies[device] = LossInputs(
                to_device(self.old_logp, device),
                to_device(self.advantages, device),
                to_device(self.mask, device),
                None if self.reference is None else to_device(self.reference, device),
                to_device(self.weights, device),
            )
        return self._copies[device]

    def rows(self, rows: Tensor, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
        """``(old_logp, advantages, mask, reference, weights)`` of the minibatch ``rows``, on ``device``."""
        on, index = self.on(device), to_device(rows, device)
        reference = None if on.reference is None else on.reference[index]
        return on.old_logp[index], on.advantages[index], on.mask[index], reference, on.weights[index]
