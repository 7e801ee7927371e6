"""The GSPO paper's three claims, read from an `rlzoo ablate` sweep of preset x router (docs/replication.md).

    python scripts/gspo_replication.py SWEEP_DIR [--figure PATH]

SWEEP_DIR holds the four cells `preset-{gspo,grpo}_router--name-{none,replay-old}` with the same seeds (each seed
shares one cold start across cells, so differences between cells are taken *within* a seed and the 95% confidence
interval is over the per-seed differences: Student t, n - 1 degrees of freedom). Prints a markdown table per claim
and writes a figure of per-step clip fraction, reward and flip rate (mean over seeds, min-max band).

Stability measures, per run: the standard deviation of step-to-step changes of `reward/mean`, and collapses, the
steps at which the 10-step moving average of `reward/mean` falls more than 0.1 below its running maximum after
having been within it (a drop and its recovery count once).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
from scipy import stats

CELLS = {
    "GSPO": "preset-gspo_router--name-none",
    "GSPO + replay": "preset-gspo_router--name-replay-old",
    "GRPO": "preset-grpo_router--name-none",
    "GRPO + replay": "preset-grpo_router--name-replay-old",
}
WINDOW, DROP = 10, 0.1


def load(run: Path) -> tuple[list[dict], dict[int, float]]:
    rows = [json.loads(line) for line in run.joinpath("metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "reward/mean" in r]
    evals = {int(r["step"]): float(r["eval/accuracy"]) for r in rows if "eval/accuracy" in r}
    return steps, evals


def series(steps: list[dict], key: str) -> np.ndarray:
    return np.array([float(r[key]) for r in steps if key in r])


def collapses(reward: np.ndarray) -> int:
    smooth = np.convolve(reward, np.ones(WINDOW) / WINDOW, mode="valid")
    count, down, best = 0, False, -np.inf
    for value in smooth:
        best = max(best, value)
        if not down and value < best - DROP:
            count, down = count + 1, True
        elif down and value >= best - DROP / 2:
            down = False
    return count


def per_run(run: Path) -> dict[str, float]:
    steps, evals = load(run)
    reward = series(steps, "reward/mean")
    return {
        "acc0": evals[min(evals)],
        "acc": evals[max(evals)],
        "gain": evals[max(evals)] - evals[min(evals)],
        "clip": float(series(steps, "clip/fraction").mean()),
        "reward_last20": float(reward[int(len(reward) * 0.8) :].mean()),
        "reward_jitter": float(np.diff(reward).std()),
        "collapses": collapses(reward),
        "flip": float(series(steps, "moe/flip_rate").mean()),
        "fresh_flip": float(
            np.mean(series(steps, "moe/fresh_flip_rate") if "moe/fresh_flip_rate" in steps[0] else 0.0)
        ),
    }


def ci(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.4g}"
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return f"{mean:.4g} ± {half:.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args()
    seeds = sorted(p.name for p in (args.sweep / CELLS["GSPO"]).glob("seed*"))
    runs = {cell: {s: per_run(args.sweep / folder / s) for s in seeds} for cell, folder in CELLS.items()}
    col = lambda cell, key: [runs[cell][s][key] for s in seeds]  # noqa: E731
    diff = lambda a, b, key: [runs[a][s][key] - runs[b][s][key] for s in seeds]  # noqa: E731

    print(f"seeds: {len(seeds)} ({', '.join(seeds)}); mean ± 95% CI over seeds\n")
    print(
        "| cell | clip/fraction | eval accuracy step 0 | final | gain | reward (last 20%) | reward jitter | "
        "collapses | moe/flip_rate |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cell in CELLS:
        keys = ["clip", "acc0", "acc", "gain", "reward_last20", "reward_jitter", "collapses", "flip"]
        print(f"| {cell} | " + " | ".join(ci(col(cell, k)) for k in keys) + " |")

    print("\n(a) GSPO vs GRPO, no replay, paired by seed")
    ratio = [runs["GSPO"][s]["clip"] / runs["GRPO"][s]["clip"] for s in seeds]
    print(f"- clip fraction ratio GSPO/GRPO: {ci(ratio)} (per seed: {', '.join(f'{r:.1f}' for r in ratio)})")
    print(f"- accuracy gain GSPO - GRPO: {ci(diff('GSPO', 'GRPO', 'gain'))}")
    print(f"- reward (last 20%) GSPO - GRPO: {ci(diff('GSPO', 'GRPO', 'reward_last20'))}")
    print("\n(b) 4 minibatches per rollout: GRPO vs GRPO + replay vs GSPO, paired by seed")
    for a, b in [("GRPO + replay", "GRPO"), ("GSPO", "GRPO")]:
        print(
            f"- {a} - {b}: final accuracy {ci(diff(a, b, 'acc'))}, reward (last 20%) "
            f"{ci(diff(a, b, 'reward_last20'))}, reward jitter {ci(diff(a, b, 'reward_jitter'))}, "
            f"collapses {ci(diff(a, b, 'collapses'))}"
        )
    print(
        "\n(c) expert flip rate per step: share of (token, layer, k) slots whose expert in an update pass differs"
        " from the old pass's; under replay, moe/fresh_flip_rate is what the router would have chosen instead"
    )
    for cell in CELLS:
        fresh = f", moe/fresh_flip_rate {ci(col(cell, 'fresh_flip'))}" if "replay" in cell else ""
        print(f"- {cell}: moe/flip_rate {ci(col(cell, 'flip'))}{fresh}")

    if args.figure is not None:
        plot(args.sweep, seeds, args.figure)


def plot(sweep: Path, seeds: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("clip/fraction", "clip fraction (log)"),
        ("reward/mean", f"reward - the seed's first {WINDOW} steps ({WINDOW}-step mean)"),
        ("moe/flip_rate", "expert flip rate"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for cell, folder in CELLS.items():
        for ax, (key, title) in zip(axes, panels):
            data = np.array([series(load(sweep / folder / s)[0], key) for s in seeds])
            if key == "reward/mean":
                # each seed has its own cold start: its level differs, so show its change from its own start
                data = np.array(
                    [np.convolve(row, np.ones(WINDOW) / WINDOW, mode="valid") - row[:WINDOW].mean() for row in data]
                )
            x = np.arange(data.shape[1])
            (line,) = ax.plot(x, data.mean(0), label=cell, lw=1.2)
            ax.fill_between(x, data.min(0), data.max(0), color=line.get_color(), alpha=0.15)
            ax.set_title(title)
            ax.set_xlabel("step")
    axes[0].set_yscale("log")
    axes[0].legend()
    fig.suptitle(
        f"GSPO vs GRPO, Routing Replay off/on: tiny Qwen3-MoE, 4 minibatches per rollout, "
        f"{len(seeds)} seeds (mean, min-max band)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"\nfigure: {path}")


if __name__ == "__main__":
    main()
