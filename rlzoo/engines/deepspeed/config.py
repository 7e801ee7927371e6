"""What the DeepSpeed engine is initialised with: DeepSpeed's config dict and the client AdamW.

The optimizer is torch AdamW as DeepSpeed's *client* optimizer (nothing is compiled) with the trainer's lr / betas /
weight decay; under DeepSpeed-MoE its parameters are split into DeepSpeed's dense and expert groups, so expert
gradients are reduced over the expert-data-parallel group only. Clipping is DeepSpeed's ``gradient_clipping``.
"""

from __future__ import annotations

from typing import Any

import torch

from rlzoo.engines.optimizer import adamw


def deepspeed_config(trainer_config: Any, zero_stage: int) -> dict[str, Any]:
    """The ``config`` of ``deepspeed.initialize`` for ``trainer_config`` (a :class:`rlzoo.config.schema.TrainerConfig`)."""
    clip = trainer_config.grad_clip
    return {
        # micro-batches vary in rows (a token budget, rlzoo.engines.micro_batches) and in number per minibatch: the
        # engine marks the accumulation boundary itself (set_gradient_accumulation_boundary); these only satisfy
        # DeepSpeed's batch-size arithmetic, and gradient_accumulation_steps 1 keeps each backward unscaled
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": float(clip) if clip is not None else 0.0,
        "zero_optimization": {"stage": zero_stage},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def client_optimizer(model: torch.nn.Module, trainer_config: Any, expert_groups: bool) -> torch.optim.AdamW:
    """torch AdamW over the trainable parameters; ``expert_groups``: DeepSpeed-MoE's dense / expert groups."""
    params = [q for q in model.parameters() if q.requires_grad]
    groups: list[dict[str, Any]] = [{"params": params, "name": "dense"}]
    if expert_groups:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        groups = split_params_into_different_moe_groups_for_optimizer(groups[0])
    return adamw(groups, trainer_config)
