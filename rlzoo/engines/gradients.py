"""What a training engine is asked for when it computes gradients without a step (:meth:`TrainingEngine.gradients`;
``rlzoo mismatch`` compares the corrections' policy gradients with them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class GradientRequest:
    """The losses to differentiate at the current weights, each a ``LossFn`` called as ``train_step`` calls its one
    (``loss_fn(logp [, entropy]) -> (loss, metrics)``, with the entropy when ``with_entropy``), and ``project``: a
    linear map from the trained parameters' gradients (in the engine's order, ``None`` for a parameter a loss does not
    reach) to one tensor. Linear, so an engine may project each micro-batch's part of a gradient and add them."""

    loss_fns: Sequence[Callable[..., tuple[torch.Tensor, dict[str, float]]]]  # rlzoo.engines.base.LossFn each
    project: Callable[[Sequence[torch.Tensor | None]], torch.Tensor]
    with_entropy: bool = False
