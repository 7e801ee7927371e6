"""Print the table of docs/gpu.md: each GPU recipe's estimated memory per rank (rlzoo.models.memory).

    python scripts/gpu_memory_table.py

One row per ``# check:`` line of each ``examples/gpu/*.yaml`` (its ``--processes`` and ``--set``), with the model's
sizes from the ``--model-config`` file the line names. Arithmetic only: nothing is built or measured.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from rlzoo.config.resolution import load_config
from rlzoo.models.memory import ModelShape
from rlzoo.preflight.memory_fit import estimate
from rlzoo.registry import default_registry
from rlzoo.util.units import GB, format_bytes, parse_bytes

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "examples" / "gpu").glob("*.yaml"))
HEADER = [
    "| recipe | processes | rollout | `trainer.device_memory` | estimate per rank | largest parts | on an 80 GB GPU |",
    "|---|---|---|---|---|---|---|",
]


def checks(recipe: Path) -> list[argparse.Namespace]:
    """The recipe's ``# check: ARGS`` lines (``rlzoo config check`` arguments after the file)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-config", required=True)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--set", action="append", default=[])
    lines = [line.split(":", 1)[1] for line in recipe.read_text().splitlines() if line.startswith("# check:")]
    return [parser.parse_args(shlex.split(line)) for line in lines]


def on_80gb(config, memory) -> str:
    """Whether the run fits an 80 GB GPU; if not, the parts that cannot shrink enough."""
    limit, vllm = 80 * GB, memory.rollout_weights if memory.device_fraction else 0
    if memory.fits(limit) and (not vllm or memory.device_fraction * limit > vllm):
        return "fits"
    if not vllm:  # a pool on devices of its own: nothing of vLLM's on the trainer's
        return f"no: training {format_bytes(memory.total())}"
    return f"no: training {format_bytes(memory.total())} + vLLM's weights {format_bytes(vllm)}"


def processes(args: argparse.Namespace) -> str:
    """The process count, and the check line's overrides but the device memory (a column of its own)."""
    sets = [f"`{item}`" for item in args.set if not item.startswith("trainer.device_memory=")]
    return f"{args.processes}" + (f" ({', '.join(sets)})" if sets else "")


def rollout(config) -> str:
    """Where the rollouts run: an engine on every rank's GPU, or a pool of servers on devices of their own."""
    engine = config.rollout.engine.name
    if engine == "vllm-server":
        return "server pool, own devices"
    return f"`{engine}` on every rank" if config.rollout.per_rank else f"`{engine}` on rank 0"


def rows() -> list[str]:
    registry, lines = default_registry(), list(HEADER)
    for recipe in RECIPES:
        for args in checks(recipe):
            config = load_config(recipe, args.set, registry)
            shape = ModelShape.from_hf(json.loads((ROOT / args.model_config).read_text()))
            memory, device = estimate(config, shape, args.processes), parse_bytes(config.trainer.device_memory)
            largest = sorted(memory.bytes_on(device).items(), key=lambda item: -item[1])[:3]
            lines.append(
                f"| `{recipe.name}` | {processes(args)} | {rollout(config)} | {config.trainer.device_memory} "
                f"| {format_bytes(memory.total(device))} | {', '.join(f'{n} {format_bytes(b)}' for n, b in largest)} "
                f"| {on_80gb(config, memory)} |"
            )
    return lines


if __name__ == "__main__":
    print("\n".join(rows()))
