"""vLLM weight sync: the ``direct`` path against the ``reload`` path, on one engine, in one run.

    python benchmarks/sync_speed.py [--scale tiny|long] [--rounds 20]

Builds the scale's model (``examples/bench/<scale>.yaml``, random init, the task's tokenizer), starts one vLLM engine
on it and then, every round, perturbs all weights and syncs them twice: once by direct copies into vLLM's fused
tensors (``rlzoo_copy_weights``) and once through vLLM's ``reload_weights`` (``rlzoo_load_weights``), in alternating
order so that load from other work hits both alike. Each path's time is the median worker call (the CPU MoE re-pack
included; the list of checkpoint tensors is built once per round, outside both timings). Prints both side by side and
the ratio. Measured numbers belong in docs/benchmarks.md, not here.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=["tiny", "long"], default="tiny")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2, help="rounds dropped at the start")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    from rlzoo.config.resolution import load_config
    from rlzoo.engines import EngineContext
    from rlzoo.engines.vllm.rollout import VLLMRolloutEngine
    from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
    from rlzoo.models.export import checkpoint_weights
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import make_task

    registry = default_registry()
    config = load_config(ROOT / "examples" / "bench" / f"{args.scale}.yaml", [], registry)
    tokenizer = build_char_tokenizer(make_task(config, registry).alphabet())
    model = build_tiny_model(config.model.tiny, tokenizer, seed=0)
    parameters = sum(p.numel() for p in model.parameters())
    timings: dict[str, list[float]] = {"direct": [], "reload": []}
    with tempfile.TemporaryDirectory() as folder:
        engine = VLLMRolloutEngine(VLLMRolloutEngine.Params(weight_sync="direct"))
        engine.start(
            EngineContext(
                model_dir=save_model(model, tokenizer, Path(folder)),
                dtype="float32",
                seed=0,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )
        try:
            calls = {"direct": "rlzoo_copy_weights", "reload": "rlzoo_load_weights"}
            for round_ in range(args.warmup + args.rounds):
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn_like(p), alpha=1e-3)
                weights = [(name, t.clone()) for name, t in checkpoint_weights(model)]
                order = ["direct", "reload"] if round_ % 2 == 0 else ["reload", "direct"]
                for path in order:
                    start = time.perf_counter()
                    engine.llm.collective_rpc(calls[path], kwargs=dict(weights=weights))
                    if round_ >= args.warmup:
                        timings[path].append(time.perf_counter() - start)
        finally:
            engine.close()

    direct, reload = (statistics.median(timings[p]) for p in ("direct", "reload"))
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    print(
        f"# {args.scale}: {parameters / 1e6:.2f}M-parameter {config.model.tiny.architecture}, "
        f"{len(weights)} checkpoint tensors, median of {args.rounds} rounds"
    )
    print("| path | ms per sync |\n|---|---:|")
    print(f"| direct (copies into vLLM's fused tensors) | {direct * 1e3:.2f} |")
    print(f"| reload (vLLM's reload_weights) | {reload * 1e3:.2f} |")
    print(f"reload / direct: {reload / direct:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
