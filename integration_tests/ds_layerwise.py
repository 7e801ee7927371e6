"""The ZeRO-3 weight push, layer by layer vs the whole-model gather: shared by test_deepspeed_layerwise.py (one
process) and, as a script, one rank of its two-process run under ``torchrun``:

    torchrun --nproc_per_node 2 integration_tests/ds_layerwise.py MODEL_DIR OUT_DIR

Every rank builds a ZeRO-3 engine with every parameter partitioned (DeepSpeed keeps parameters below
``stage3_param_persistence_threshold``, 1e5 elements by default, whole on every rank, which would be all of a tiny
model's), trains one step on its share of the batch, then consumes :meth:`named_weights` (rank 1 only drains it, as a
rank that receives nothing does in ``Learner.push_weights``) and gathers the whole model once for reference. Rank 0
writes ``OUT_DIR/layerwise.safetensors``, ``OUT_DIR/whole.safetensors`` and ``OUT_DIR/record.json`` (the names in
order and the gathered-element counts of :func:`measure`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch


@contextmanager
def every_parameter_partitioned() -> Iterator[None]:
    """Engines started inside partition even the tiny model's parameters (persistence threshold 0)."""
    import rlzoo.engines.deepspeed.trainer as trainer

    original = trainer.deepspeed_config

    def config(trainer_config, zero_stage):
        ds_config = original(trainer_config, zero_stage)
        ds_config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return ds_config

    trainer.deepspeed_config = config
    try:
        yield
    finally:
        trainer.deepspeed_config = original


def gathered_elements(model: torch.nn.Module) -> int:
    """Elements of the partitioned parameters that are gathered (whole) on this rank right now."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return sum(
        p.ds_numel
        for p in model.parameters()
        if getattr(p, "ds_status", None) == ZeroParamStatus.AVAILABLE and not p.ds_persist
    )


def measure(engine, receives: bool = True):
    """``(layerwise, whole, record)``: the engine's weights as :meth:`named_weights` yields them (the most elements
    gathered while any was yielded), and as the whole-model gather gives them (the elements gathered inside it)."""
    from rlzoo.engines.deepspeed.checkpoint import hf_model
    from rlzoo.engines.deepspeed.layerwise import largest_unit
    from rlzoo.models.export import checkpoint_weights

    model = engine.model
    before = gathered_elements(model)
    peak, layerwise = 0, []
    for name, tensor in engine.named_weights():
        peak = max(peak, gathered_elements(model))
        if receives:
            layerwise.append((name, tensor))
    with hf_model(engine.engine, engine.placement) as whole_model:
        whole_gathered = gathered_elements(model)
        whole = [(name, tensor.clone()) for name, tensor in checkpoint_weights(whole_model)]
    record = {
        "before": before,
        "after": gathered_elements(model),
        "layerwise_peak": peak,
        "whole_gathered": whole_gathered,
        "largest_unit": largest_unit(model),
        "total": sum(p.ds_numel for p in model.parameters()),
        "layerwise_names": [n for n, _ in layerwise],
        "whole_names": [n for n, _ in whole],
    }
    return layerwise, whole, record


def main() -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist
    from ds_two_process import PROMPTS, global_batch, loss_fn, trainer_config
    from safetensors.torch import save_file

    from rlzoo.engines import EngineContext
    from rlzoo.engines.deepspeed.trainer import DeepSpeedTrainingEngine
    from rlzoo.engines.tokens import select_rows
    from rlzoo.models import load_model

    model_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    _, tokenizer = load_model(model_dir)
    engine = DeepSpeedTrainingEngine(DeepSpeedTrainingEngine.Params(zero_stage=3))
    context = EngineContext(model_dir, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    with every_parameter_partitioned():
        engine.start(context, trainer_config(0.5))
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = torch.tensor_split(torch.arange(len(PROMPTS)), world)[rank]
    engine.train_step(select_rows(global_batch(tokenizer), rows), loss_fn)
    layerwise, whole, record = measure(engine, receives=rank == 0)
    if rank == 0:
        save_file({n: t.contiguous() for n, t in layerwise}, str(out_dir / "layerwise.safetensors"))
        save_file({n: t.contiguous() for n, t in whole}, str(out_dir / "whole.safetensors"))
        (out_dir / "record.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
