"""One rank of the two-process micro-batch check, started by ``torchrun`` (used by test_micro_batches_two_process.py).

    torchrun --nproc_per_node 2 integration_tests/ds_micro_batches.py MODEL_DIR OUT_DIR OBJECTIVES_JSON

For every objective (a name and an algorithm dict) the gradient of one minibatch split over both ranks is computed
once in one forward per rank and once in micro-batches of a small token budget (the ranks then need different
numbers of micro-batches): in float64 with the torch engine on each rank and the ranks' gradients averaged as a
data-parallel engine does (DeepSpeed reduces no float64 gradient), and in float32 with the DeepSpeed engine at
ZeRO 0 and 2 (its own accumulation boundary and reduction). Rank 0 writes ``OUT_DIR/NAME-ENGINE.json``: both
losses, the micro-batch counts and the largest gradient difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROWS = 10


def minibatch(vocab: int):
    from rlzoo.engines.tokens import make_token_batch

    g = torch.Generator().manual_seed(7)
    # the second rank's rows are longer: it needs more micro-batches than the first
    lengths = [(3, 2), (2, 3), (4, 1), (2, 2), (3, 3), (5, 8), (6, 7), (4, 8), (5, 6), (6, 8)]
    prompts = [torch.randint(2, vocab, (p,), generator=g).tolist() for p, _ in lengths]
    responses = [torch.randint(2, vocab, (r,), generator=g).tolist() for _, r in lengths]
    return make_token_batch(prompts, responses, 0, response_width=8)


ENGINES = {"torch-float64": None, "deepspeed-zero0": 0, "deepspeed-zero2": 2}


def gradient(model_dir: Path, algorithm: dict, budget: int, batch, dist, engine_name: str):
    import torch.distributed

    import rlzoo
    from rlzoo.config.schema import TrainerConfig
    from rlzoo.engines import EngineContext
    from rlzoo.engines.deepspeed.trainer import DeepSpeedTrainingEngine
    from rlzoo.engines.tokens import select_rows
    from rlzoo.engines.torch_trainer import TorchTrainingEngine
    from rlzoo.rl.learner import Learner

    stage = ENGINES[engine_name]
    engine = (
        TorchTrainingEngine()
        if stage is None
        else DeepSpeedTrainingEngine(DeepSpeedTrainingEngine.Params(zero_stage=stage))
    )
    trainer = TrainerConfig(max_tokens_per_micro_batch=budget, grad_clip=None)
    engine.start(EngineContext(model_dir, pad_token_id=0, eos_token_id=1), trainer)
    dtype = torch.float64 if stage is None else torch.float32
    engine.model.to(dtype)
    learner = Learner(engine, dist)
    objective = rlzoo.build_objective(algorithm)
    g = torch.Generator().manual_seed(3)
    old_logp = learner.logprobs(batch) + 0.05 * torch.randn(batch.response_mask.shape, generator=g, dtype=dtype)
    advantages = torch.randn(ROWS, 1, generator=g, dtype=dtype).expand_as(old_logp).contiguous()
    rows = torch.arange(ROWS)

    def loss_fn(logp):
        return objective(logp, old_logp, advantages, batch.response_mask, seed=5)

    local = select_rows(batch, dist.share(rows))
    metrics = engine.accumulate_gradients(local, learner._global_loss(loss_fn, ROWS))
    if stage is None:  # what a data-parallel engine does: the mean of the ranks' gradients
        for param in engine.model.parameters():
            torch.distributed.all_reduce(param.grad)
            param.grad /= dist.world
        grads = {n: p.grad.detach().clone() for n, p in engine.model.named_parameters()}
    elif stage == 0:
        grads = {n: p.grad.detach().clone() for n, p in engine.model.named_parameters()}
    else:  # ZeRO-2 holds the reduced gradients in partitions: the step's global norm stands for them
        grads = {"norm": torch.tensor([_zero_norm(engine)])}
    return metrics["loss/total"], metrics["train/micro_batches"], grads


def _zero_norm(engine) -> float:
    """ZeRO 1-2: the global gradient norm DeepSpeed computes from its reduced partitions (clipping off)."""
    engine.engine.step()
    return float(engine.engine.get_global_grad_norm())


def main() -> None:
    torch.set_num_threads(1)
    from rlzoo.engines.deepspeed.env import init_deepspeed_distributed
    from rlzoo.runtime.distributed import setup

    model_dir, out_dir, objectives = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    init_deepspeed_distributed("gloo")
    dist = setup("gloo")
    batch = minibatch(12)
    runs = [(name, algorithm, engine) for name, algorithm in objectives.items() for engine in ENGINES]
    for name, algorithm, engine in runs:
        if engine != "torch-float64" and name not in ("token-mean", "kl-cov"):
            continue
        loss_one, count_one, one = gradient(model_dir, algorithm, 100_000, batch, dist, engine)
        loss_many, count_many, many = gradient(model_dir, algorithm, 10, batch, dist, engine)
        gap = max(float((one[k] - many[k]).abs().max()) for k in one)
        largest = max(float(v.abs().max()) for v in one.values())
        if dist.is_main:
            record = {
                "loss_one": loss_one,
                "loss_many": loss_many,
                "micro_batches": [count_one, count_many],
                "max_grad_gap": gap,
                "max_grad": largest,
                "same_keys": sorted(one) == sorted(many),
            }
            (out_dir / f"{name}-{engine}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
