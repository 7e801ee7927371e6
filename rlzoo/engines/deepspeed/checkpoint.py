"""Checkpoints of the DeepSpeed engine: the Hugging Face view of its model, per-rank optimizer state, the layout.

:func:`save_checkpoint` writes ``dir/model``, a Hugging Face folder (safetensors, experts in the checkpoint layout,
parameters gathered under ZeRO-3); ``dir/deepspeed.json``, the layout (:func:`checkpoint_layout`); and
``dir/optimizer/rank{r:05d}/``, each rank's optimizer state in :func:`rlzoo.runtime.checkpoint.files.save_optimizer`'s
pickle-free format: at ZeRO 0 the AdamW state of the rank's parameters, at ZeRO 1-3 the AdamW state of the rank's
flat fp32 partitions. The fp32 master weights are not stored separately: the model parameters are fp32 and equal
to them after every step, and :func:`load_checkpoint` rebuilds the master partitions from the loaded weights.
Resuming is exact with the same ZeRO stage, ``moe``, ``ep_size`` and world size (checked); other combinations are
refused with an error. Both are collectives: every rank calls them. They take what they use, DeepSpeed's engine
and the :class:`Placement` of its state, not the rlzoo engine that holds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlzoo.engines.deepspeed.moe_blocks import ModelMoe
from rlzoo.runtime.checkpoint.files import load_optimizer, save_optimizer

CHECKPOINT_FORMAT = "rlzoo-deepspeed-1"


@dataclass(frozen=True)
class Placement:
    """How the engine's state is spread over the processes, and which share is this process's."""

    zero_stage: int
    moe: ModelMoe  # the MoE layout (trainer.engine.moe)
    ep_size: int
    world_size: int
    rank: int


def checkpoint_layout(placement: Placement) -> dict[str, Any]:
    """What a checkpoint must match to be resumed exactly (written as ``deepspeed.json``)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "zero_stage": placement.zero_stage,
        "moe": placement.moe.name,
        "ep_size": placement.ep_size,
        "world_size": placement.world_size,
    }


@contextmanager
def hf_model(
    ds_engine: Any, placement: Placement, write_back: bool = False, modifier_rank: int | None = None
) -> Iterator[torch.nn.Module]:
    """The model of ``ds_engine`` (DeepSpeed's engine) as a plain transformers model: ZeRO-3 parameters gathered,
    DeepSpeed-MoE blocks swapped back.

    ``write_back`` (DeepSpeed-MoE): expert weights changed inside the block are copied back on exit;
    ``modifier_rank`` (ZeRO-3): the rank whose changes are scattered back. A collective under ZeRO-3 and expert
    parallelism.
    """
    model = ds_engine.module
    if placement.zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=modifier_rank):
            yield model
    else:
        with placement.moe.hf_view(model, write_back) as view:
            yield view


@contextmanager
def torch_optimizer(ds_engine: Any, zero_stage: int) -> Iterator[torch.optim.Optimizer]:
    """The torch AdamW that holds the state: the client optimizer itself at ZeRO 0, ZeRO's inner one above.

    ZeRO-3 keeps the inner optimizer's parameter groups empty between steps; they are filled with this rank's
    fp32 partitions while the state is read or written, as DeepSpeed's own checkpointing does.
    """
    optimizer = ds_engine.optimizer
    if zero_stage == 0:
        yield optimizer
    elif zero_stage == 3:
        optimizer._set_fp32_optimizer_param_groups()
        try:
            yield optimizer.optimizer
        finally:
            optimizer._clear_fp32_optimizer_param_groups()
    else:
        yield optimizer.optimizer


def save_checkpoint(ds_engine: Any, placement: Placement, directory: Path) -> None:
    """``directory/model`` (HF folder, rank 0), ``deepspeed.json`` and per-rank optimizer state. Collective."""
    import torch.distributed as dist

    directory = Path(directory)
    with hf_model(ds_engine, placement) as model:
        if placement.rank == 0:
            model.save_pretrained(directory / "model", safe_serialization=True)
    rank_dir = directory / "optimizer" / f"rank{placement.rank:05d}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    with torch_optimizer(ds_engine, placement.zero_stage) as optimizer:
        save_optimizer(optimizer, rank_dir)
    if placement.rank == 0:
        (directory / "deepspeed.json").write_text(json.dumps(checkpoint_layout(placement), indent=1))
    if placement.world_size > 1:
        dist.barrier()


def load_checkpoint(ds_engine: Any, placement: Placement, directory: Path, lora: bool) -> None:
    """Restore weights (master copies included) and optimizer state written by :func:`save_checkpoint`. Collective."""
    from safetensors.torch import load_file

    from rlzoo.engines.lora import load_adapter
    from rlzoo.models.weights import load_checkpoint_weights

    directory = Path(directory)
    layout_file = directory / "deepspeed.json"
    if not layout_file.is_file():
        raise FileNotFoundError(f"{directory} has no deepspeed.json: not a checkpoint of the deepspeed engine")
    saved, expected = json.loads(layout_file.read_text()), checkpoint_layout(placement)
    if saved != expected:
        raise ValueError(
            f"checkpoint {directory} was written with {saved}; this engine is {expected}:"
            " resuming needs the same ZeRO stage, moe, ep_size and world size"
        )
    files = sorted((directory / "model").glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory / 'model'} holds no safetensors weights")
    with hf_model(ds_engine, placement, write_back=True, modifier_rank=0) as model:
        if placement.zero_stage < 3 or placement.rank == 0:
            if lora:  # the adapters alone: the base weights are the initial model's, loaded at start
                load_adapter(model, directory / "model")
            else:
                weights: dict[str, torch.Tensor] = {}  # load_checkpoint_weights checks that nothing is missing
                for file in files:
                    weights.update(load_file(str(file)))
                load_checkpoint_weights(model, weights.items())
    ds_optimizer = ds_engine.optimizer
    if placement.zero_stage > 0:
        ds_optimizer.refresh_fp32_params()  # master partitions from the loaded fp32 weights
    with torch_optimizer(ds_engine, placement.zero_stage) as optimizer:
        load_optimizer(optimizer, directory / "optimizer" / f"rank{placement.rank:05d}")
    if hasattr(ds_optimizer, "_hp_optimizer_states_linked"):
        ds_optimizer._hp_optimizer_states_linked = False  # re-link DeepSpeed's views on the new state
