"""One rank of a multi-process DeepSpeed-engine run, started by ``torchrun`` (used by test_deepspeed_engine.py).

    torchrun --nproc_per_node 2 integration_tests/ds_two_process.py MODEL_DIR OUT_DIR CONFIG_JSON

CONFIG_JSON is a list of runs, each ``{"name": ..., "params": {engine params}, "grad_clip": float | null}``. Every
run builds a fresh engine, trains it for ``STEPS`` steps on this rank's contiguous share of the fixed global batch
from :func:`global_batch` with :func:`loss_fn` (a mean over rows, so the mean of the ranks' losses is the loss
of the whole batch), and rank 0 writes ``OUT_DIR/NAME.json`` (per-step global loss and grad norm) and
``OUT_DIR/NAME.safetensors`` (final checkpoint-format weights).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

STEPS = 3
PROMPTS = ["1+2=", "33+4=", "5+66=", "7+8=", "12+9=", "4+4=", "90+1=", "6+27="]
RESPONSES = ["3", "37", "71", "15", "21", "8", "91", "33"]
LR = 1e-2


def global_batch(tokenizer):
    from rlzoo.engines.tokens import make_token_batch

    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    responses = [tokenizer(r)["input_ids"] + [tokenizer.eos_token_id] for r in RESPONSES]
    return make_token_batch(prompts, responses, tokenizer.pad_token_id)


def loss_fn(logp: torch.Tensor):
    loss = -(logp.sum(dim=1)).mean()
    return loss, {"loss": float(loss.detach())}


def trainer_config(grad_clip):
    from rlzoo.config.schema import TrainerConfig

    return TrainerConfig(lr=LR, grad_clip=grad_clip)


def main() -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist
    from safetensors.torch import save_file

    from rlzoo.engines import EngineContext
    from rlzoo.engines.deepspeed.trainer import DeepSpeedTrainingEngine
    from rlzoo.engines.tokens import select_rows
    from rlzoo.models import load_model

    model_dir, out_dir, runs = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    _, tokenizer = load_model(model_dir)
    batch = global_batch(tokenizer)
    for run in runs:
        engine = DeepSpeedTrainingEngine(DeepSpeedTrainingEngine.Params(**run["params"]))
        context = EngineContext(model_dir, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        engine.start(context, trainer_config(run.get("grad_clip")))
        rank, world = dist.get_rank(), dist.get_world_size()
        rows = torch.tensor_split(torch.arange(len(PROMPTS)), world)[rank]
        local = select_rows(batch, rows)
        losses, norms = [], []
        for _ in range(STEPS):
            metrics = engine.train_step(local, loss_fn)
            loss = torch.tensor([metrics["loss"]], dtype=torch.float64)
            dist.all_reduce(loss)
            losses.append(float(loss) / world)
            norms.append(metrics["train/grad_norm"])
        weights = {name: tensor.detach().clone().contiguous() for name, tensor in engine.named_weights()}

        checkpoint = out_dir / f"{run['name']}_checkpoint"
        checkpoint.mkdir(parents=True, exist_ok=True)
        engine.save(checkpoint)
        continued = engine.train_step(local, loss_fn)["loss"]
        continued_weights = dict(engine.named_weights())
        resumed_engine = DeepSpeedTrainingEngine(DeepSpeedTrainingEngine.Params(**run["params"]))
        resumed_engine.start(context, trainer_config(run.get("grad_clip")))
        resumed_engine.load_state(checkpoint)
        resumed = resumed_engine.train_step(local, loss_fn)["loss"]
        resumed_weights = dict(resumed_engine.named_weights())
        resume_gap = max(float((continued_weights[k] - resumed_weights[k]).abs().max()) for k in continued_weights)

        if rank == 0:
            record = {
                "losses": losses,
                "grad_norms": norms,
                "resume": {"continued_loss": continued, "resumed_loss": resumed, "max_weight_gap": resume_gap},
            }
            save_file(weights, str(out_dir / f"{run['name']}.safetensors"))
            (out_dir / f"{run['name']}.json").write_text(json.dumps(record))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
