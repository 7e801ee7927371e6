"""The training engines' optimizer: torch's AdamW with the trainer's settings (``trainer.lr``, ``betas``,
``weight_decay``), built here for both engines so that they step alike.

It is torch's fused implementation, one kernel over every tensor: on the CPU torch otherwise runs its per-tensor
loop, which took 0.21-0.42 s a step on SmolLM2-135M's parameters against 0.08 s fused (docs/benchmarks.md); the
updates agree to float rounding (1.2e-7 after 6 steps there).
"""

from __future__ import annotations

from typing import Any

import torch


def adamw(params: Any, trainer_config: Any) -> torch.optim.AdamW:
    """AdamW over ``params`` (tensors or parameter groups) with the trainer's learning rate, betas and weight decay."""
    return torch.optim.AdamW(
        params,
        lr=trainer_config.lr,
        betas=tuple(trainer_config.betas),
        weight_decay=trainer_config.weight_decay,
        fused=True,
    )
