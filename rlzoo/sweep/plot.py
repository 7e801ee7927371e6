"""``ablation.png``: per cell, the mean curve over seeds with its 95% CI band (Student t), for reward, held-out
accuracy, clip fraction and expert flip rate (a dense model's runs log none: response length instead)."""

from __future__ import annotations

import math
from pathlib import Path

from rlzoo.sweep.stats import mean_ci
from rlzoo.sweep.summary import RunRecord

PANELS = [
    ("reward/mean", "reward"),
    ("eval/accuracy", "held-out accuracy"),
    ("clip/fraction", "clip fraction"),
    ("moe/flip_rate", "expert flip rate"),
]
DENSE_PANEL = ("response/length_mean", "response length")  # in the flip rate's place where no run logged it


def curve(runs: list[RunRecord], key: str) -> tuple[list[int], list[float], list[float]]:
    """Steps where ``key`` was logged, the mean over the runs that logged it there, and the CI half-width."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for row in run.rows:
            if isinstance(row.get(key), (int, float)):
                by_step.setdefault(row["step"], []).append(row[key])
    steps = sorted(by_step)
    stats = [mean_ci(by_step[s]) for s in steps]
    return steps, [m for m, _ in stats], [0.0 if math.isnan(h) else h for _, h in stats]


def plot_ablation(records: list[RunRecord], out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells: dict[str, list[RunRecord]] = {}
    for record in records:
        cells.setdefault(record.cell, []).append(record)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    logged = {key for record in records for row in record.rows for key in row}
    panels = [DENSE_PANEL if key == "moe/flip_rate" and key not in logged else (key, name) for key, name in PANELS]
    for ax, (key, name) in zip(axes.flat, panels):
        drawn = False
        for cell, runs in cells.items():
            steps, mean, half = curve(runs, key)
            if not steps:
                continue
            line = ax.plot(steps, mean, label=f"{cell} (n={len(runs)})", marker="o" if len(steps) < 30 else None)
            low = [m - h for m, h in zip(mean, half)]
            high = [m + h for m, h in zip(mean, half)]
            ax.fill_between(steps, low, high, color=line[0].get_color(), alpha=0.2)
            drawn = True
        ax.set_title(f"{name} ({key})")
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"{title}  mean over seeds, band: 95% CI (Student t)".strip())
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
