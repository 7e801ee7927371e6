"""Issue 50's collapse experiment: does routing mismatch destabilise token-level GRPO on an MoE model, and do
Routing Replay (R2, R3) or GSPO's sequence ratio prevent it? (GSPO paper, Zheng et al. 2025, §5.3: without replay
GRPO "fails to converge normally" on MoE; Routing Replay is its fix.)

    python results/collapse.py              # build the start model, run what is missing, then docs/collapse.md
    python results/collapse.py --table      # docs/collapse.md again from the archive, nothing run

Setting (``results/collapse.yaml``): a tiny Qwen3-MoE with 32 experts (top-2), bf16 on both sides and four
off-policy minibatches per rollout, so routing drifts between the rollout engine and the trainer and between
minibatches; each algorithm at two learning rates, the main job's (2e-4) and 5x it. One start model (``rlzoo sft``, shared by every cell so the cells differ only in
the algorithm), then four cells x 3 seeds with ``rlzoo ablate``, resumable like the results table. Finished runs are
archived in ``results/collapse_runs/<cell>/seed<S>/`` with their provenance; the page is generated from the archive.

Collapse is stated as a rule, not judged by eye: a run *collapsed* when its final held-out accuracy is below half of
its own peak (the start, step 0, counts as a point); the change from the start is a column of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from results import sweeps  # noqa: E402 - the repository root on the path first
from rlzoo.reporting.metrics_log import read_metrics  # noqa: E402
from rlzoo.sweep.stats import mean_ci  # noqa: E402

BASE_CONFIG = HERE / "collapse.yaml"
ARCHIVE = HERE / "collapse_runs"
SEEDS = 3
ALGORITHMS: dict[str, list[str]] = {
    "grpo": [],
    "grpo + R2 (replay-old)": ["algorithm.router={name: replay-old}"],
    "grpo + R3 (replay-rollout)": ["algorithm.router={name: replay-rollout}"],
    "gspo": ["algorithm.preset=gspo"],
}
LEARNING_RATES = ["2e-4", "1e-3"]  # the main job's, and 5x it (where routing drifts fastest)
CELLS: dict[str, list[str]] = {
    f"{name}, lr {lr}": [*sets, f"trainer.lr={lr}"] for lr in LEARNING_RATES for name, sets in ALGORITHMS.items()
}
MEANS = {  # column -> the per-step metric averaged over a run's steps
    "router flips between minibatches": "moe/flip_rate",
    "rollout-trainer expert disagreement": "moe/rollout_train_disagreement",
    "mean abs Δ log p rollout-trainer": "mismatch/abs_logp_diff",
}


def folder(cell: str) -> str:
    """``grpo + R2 (replay-old), lr 1e-3`` -> ``grpo+R2_lr1e-3``."""
    name, lr = cell.split(", lr ")
    return name.split(" (")[0].replace(" + ", "+").replace(" ", "_") + f"_lr{lr}"


def start_model(out: Path) -> Path:
    """The shared start model: the config's cold start, built once by ``rlzoo sft`` (reused while unchanged)."""
    target = out / "start"
    sets = ["--set", f"cold_start.output_dir={target}", "--set", f"output_dir={out / 'sft'}"]
    subprocess.run([sys.executable, "-m", "rlzoo.cli", "sft", str(BASE_CONFIG), *sets], cwd=ROOT, check=True)
    return target


def run_cell(cell: str, start: Path, out: Path) -> int:
    sets = [f"model.path={start}", "cold_start.enabled=false", *CELLS[cell]]  # a path wins over `tiny`
    return sweeps.run_sweep(BASE_CONFIG, sets, SEEDS, out / folder(cell), cell)


def run_values(run_dir: Path) -> dict[str, Any]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [(int(r["step"]), float(r["eval/accuracy"])) for r in rows if "eval/accuracy" in r]
    train = [r for r in rows if "reward/mean" in r]
    start, final = evals[0][1], evals[-1][1]
    peak = max(a for _, a in evals)
    values: dict[str, Any] = {
        "seed": int(yaml.safe_load((run_dir / "config.yaml").read_text())["seed"]),
        "start accuracy": start,
        "peak accuracy": peak,
        "final accuracy": final,
        "drawdown (peak - final)": peak - final,
        "max grad norm": max(r.get("train/grad_norm", math.nan) for r in train),
        "change (final - start)": final - start,
        "collapsed": final < 0.5 * peak,
        "curve": evals,
        "provenance": json.loads((run_dir / "provenance.json").read_text()),
    }
    for column, key in MEANS.items():
        seen = [float(r[key]) for r in train if key in r]
        values[column] = sum(seen) / len(seen) if seen else math.nan
    return values


def _pm(values: list[float], digits: int = 3) -> str:
    mean, half = mean_ci(values)
    if not math.isfinite(mean):
        return "—"
    fmt = f"{{:.{digits}{'e' if 0 < abs(mean) < 1e-2 else 'f'}}}"
    return fmt.format(mean) + (f" ± {fmt.format(half)}" if math.isfinite(half) else "")


def write_page(archive: Path, docs: Path) -> list[Path]:
    """``docs/collapse.md`` and its plot from the archived runs (cells without runs listed as not run yet)."""
    runs = {
        cell: [run_values(d) for d in sorted((archive / folder(cell)).glob("seed*")) if d.is_dir()] for cell in CELLS
    }
    columns = [
        "start accuracy",
        "peak accuracy",
        "final accuracy",
        "change (final - start)",
        "drawdown (peak - final)",
        "max grad norm",
        *MEANS,
    ]
    lines = [
        "# Does routing mismatch collapse token-level GRPO on an MoE model?",
        "",
        "<!-- generated by `python results/collapse.py --table` from results/collapse_runs/: do not edit -->",
        "",
        "Issue 50's experiment ([mismatch.md](mismatch.md#findings-on-this-machine) discusses it): "
        + (__doc__ or "").split("\n\n")[2].replace("\n", " ").replace("``", "`"),
        "",
        "Collapse rule: final held-out accuracy below half of the run's own peak (the start counts as a point). "
        "Cells: mean ± 95% CI (Student t) over seeds; the seeds vary the RL run from one start model.",
        "",
        "| cell | seeds | collapsed | " + " | ".join(columns) + " |",
        "|---|---:|---:|" + "---:|" * len(columns),
    ]
    for cell, values in runs.items():
        if not values:
            lines.append(f"| {cell} | 0 | not run yet |" + " |" * len(columns))
            continue
        stats = [_pm([v[c] for v in values]) for c in columns]
        collapsed = sum(v["collapsed"] for v in values)
        lines.append(f"| {cell} | {len(values)} | {collapsed} of {len(values)} | " + " | ".join(stats) + " |")
    lines += ["", "![held-out accuracy](collapse/curves.png)", "", "## Where each run ran", ""]
    for cell, values in runs.items():
        for v in values:
            p = v["provenance"]
            lines.append(
                f"- {cell}, seed {v['seed']}: {p['machine']['cpu']} ({p['machine']['cores']} "
                f"cores), commit {p['commit']}, load {p['load_average_1_5_15']}, archived {p['archived_at']}"
                + (f"; {p['note']}" if p["note"] else "")
            )
    docs.mkdir(parents=True, exist_ok=True)
    page = docs / "collapse.md"
    page.write_text("\n".join(lines) + "\n")
    return [page, plot(runs, docs / "collapse" / "curves.png")]


def plot(runs: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(LEARNING_RATES), figsize=(6 * len(LEARNING_RATES), 4.5), sharey=True)
    for ax, lr in zip(axes, LEARNING_RATES):
        for cell, values in runs.items():
            if not cell.endswith(f", lr {lr}"):
                continue
            by_step: dict[int, list[float]] = defaultdict(list)
            for v in values:
                for step, accuracy in v["curve"]:
                    by_step[step].append(accuracy)
            if not by_step:
                continue
            steps = sorted(by_step)
            stats = [mean_ci(by_step[s]) for s in steps]
            means = [m for m, _ in stats]
            half = [h if math.isfinite(h) else 0.0 for _, h in stats]
            (line,) = ax.plot(steps, means, label=f"{cell.split(', lr')[0]} ({len(values)} seeds)")
            lower, upper = [m - h for m, h in zip(means, half)], [m + h for m, h in zip(means, half)]
            ax.fill_between(steps, lower, upper, alpha=0.15, color=line.get_color())
        ax.set_xlabel("step")
        ax.set_title(f"lr {lr}")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("held-out accuracy (mean, 95% CI over seeds)")
    fig.suptitle("32-expert tiny MoE, bf16, 4 off-policy minibatches per rollout")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="runs/collapse", help="the sweeps' folder (default runs/collapse)")
    p.add_argument("--table", action="store_true", help="only rebuild docs/collapse.md from the archive")
    p.add_argument("--note", default="", help="recorded with each run archived now: what else ran on the machine")
    args = p.parse_args()
    failed = []
    if not args.table:
        out = Path(args.out).resolve()
        start = start_model(out)
        failed = sweeps.run_missing(
            CELLS,
            SEEDS,
            run=lambda cell: run_cell(cell, start, out),
            sweep=lambda cell: out / folder(cell),
            archive=lambda cell: ARCHIVE / folder(cell),
            note=args.note,
        )
    return sweeps.report(write_page(ARCHIVE, ROOT / "docs"), failed, "cells that did not finish")


if __name__ == "__main__":
    sys.exit(main())
