"""Step-time breakdown: where an RL step's time goes, per engine combination, measured in one run.

    python benchmarks/step_breakdown.py [--config examples/gspo_tiny_moe.yaml] [--steps 30] [--set k=v ...]

Each engine combination trains the same config (same cold start, same seed) for ``--steps`` steps in its own
subprocess (vLLM fixes the process's torch threads, so engines never share a process). The first
``--warmup`` steps are dropped. Prints seconds per step in rollout / verify / old log-probs / train / sync,
rollout tokens per second, and the ratios against the first combination (transformers-generate + torch).
Combinations whose engine is not installed are reported as skipped, not guessed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ENGINES, PHASES, ROOT, available  # benchmarks/ is the script's directory, first on sys.path

COMBINATIONS = [
    ("hf", "torch", []),
    ("vllm", "torch", []),
    ("hf", "deepspeed", []),
    ("vllm", "deepspeed", []),
]


def run_one(
    config: str, rollout: str, trainer: str, steps: int, cold_start: Path, out: Path, extra: list[str]
) -> list[dict]:
    args = [
        sys.executable,
        "-m",
        "rlzoo.cli",
        "train",
        config,
        "--set",
        f"output_dir={out}",
        "--set",
        f"cold_start.output_dir={cold_start}",
        "--set",
        f"rollout.engine={ENGINES[rollout]}",
        "--set",
        f"trainer.engine={ENGINES[trainer]}",
        "--set",
        f"train.steps={steps}",
        "--set",
        f"train.eval_every={steps + 1}",
        "--set",
        f"train.checkpoint_every={steps}",
        "--set",
        "train.eval_prompts=8",
    ]
    for item in extra:
        args += ["--set", item]
    done = subprocess.run(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    if done.returncode != 0:
        raise SystemExit(f"{rollout}+{trainer} failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"reward/mean"' in line]


def summarise(rows: list[dict], responses_per_step: int) -> dict[str, float]:
    summary = {p: statistics.mean(r.get(f"time/{p}", 0.0) for r in rows) for p in PHASES}
    summary["step"] = sum(summary[p] for p in PHASES)
    tokens = statistics.mean(r["response/length_mean"] * responses_per_step for r in rows)
    summary["rollout_tokens_per_s"] = tokens / summary["rollout"] if summary["rollout"] else float("nan")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "examples" / "gspo_tiny_moe.yaml"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from rlzoo.config.resolution import load_config

    config = load_config(args.config, args.set)
    responses = config.rollout.prompts_per_step * config.rollout.group_size
    work = Path(tempfile.mkdtemp(prefix="rlzoo-bench-"))
    cold_start = work / "cold_start"
    print(
        f"# {time.strftime('%Y-%m-%d')} {platform.machine()} {os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    print(f"# config {args.config}, {args.steps} steps ({args.warmup} warm-up dropped), {responses} responses/step")
    results: dict[str, dict[str, float]] = {}
    installed = {"vllm": available("vllm"), "deepspeed": available("deepspeed"), "hf": True, "torch": True}
    for rollout, trainer, extra in COMBINATIONS:
        label = f"{rollout}+{trainer}"
        if not (installed[rollout] and installed[trainer]):
            print(f"{label:<18} skipped ({'vllm' if not installed[rollout] else 'deepspeed'} not installed)")
            continue
        rows = run_one(args.config, rollout, trainer, args.steps, cold_start, work / label, args.set + extra)
        results[label] = summarise(rows[args.warmup :], responses)

    header = f"{'engines':<18}" + "".join(f"{p:>13}" for p in [*PHASES, "step"]) + f"{'tokens/s':>11}"
    print(header)
    for label, s in results.items():
        print(
            f"{label:<18}"
            + "".join(f"{s[p]:>13.4f}" for p in [*PHASES, "step"])
            + f"{s['rollout_tokens_per_s']:>11.0f}"
        )
    base = results.get("hf+torch")
    if base:
        print("\nratios against hf+torch (>1 = faster):")
        for label, s in results.items():
            if label == "hf+torch":
                continue
            print(
                f"  {label:<16} rollout x{base['rollout'] / s['rollout']:.2f}  train x{base['train'] / s['train']:.2f}  "
                f"sync x{base['sync'] / s['sync']:.2f}  step x{base['step'] / s['step']:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
