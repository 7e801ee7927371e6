"""``rlzoo plot RUN_DIR``: PNG curves of a run's metrics (reward, held-out accuracy and reward, clip fraction, KL, length; with
multi-turn episodes also tool calls per episode, turns and truncation, tool errors; with a critic its value loss
and explained variance, and the KL in the reward)."""

from __future__ import annotations

from pathlib import Path

from rlzoo.errors import RlzooError
from rlzoo.reporting.metrics_log import read_metrics

PANELS = [
    ("reward", ["reward/mean"]),
    ("held-out accuracy and reward", ["eval/accuracy", "eval/reward_mean"]),
    ("clip fraction", ["clip/fraction", "clip/low_fraction", "clip/high_fraction"]),
    ("KL", ["kl/old_approx", "kl/ref"]),
    ("response length", ["response/length_mean"]),
    ("seconds per step", ["time/rollout", "time/train", "time/sync"]),
]
#: drawn too when the run has multi-turn episodes (episode/* logged)
EPISODE_PANELS = [
    ("tool calls per episode", ["tool/calls_per_episode", "eval/tool_calls_per_episode"]),
    ("episodes", ["episode/turns_mean", "episode/truncated"]),
    ("tool errors and timeouts", ["tool/errors", "tool/timeouts"]),
]

#: drawn too when the run trains a critic (critic/* logged)
CRITIC_PANELS = [
    ("critic: explained variance", ["critic/explained_variance"]),
    ("critic: value loss", ["critic/vf_loss", "critic/vf_clipfrac"]),
    ("KL in the reward", ["kl/in_reward", "kl/coef"]),
]


def plot_run(run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(Path(run_dir) / "metrics.jsonl", need_rows=True)
    if not rows:
        raise RlzooError(f"{run_dir} has no metrics.jsonl (or it is empty): nothing to plot")
    panels = PANELS + (EPISODE_PANELS if any("episode/turns_mean" in r for r in rows) else [])
    panels += CRITIC_PANELS if any("critic/vf_loss" in r for r in rows) else []
    nrows = -(-len(panels) // 3)
    fig, axes = plt.subplots(nrows, 3, figsize=(15, 4 * nrows), constrained_layout=True)
    for ax, (title, keys) in zip(axes.flat, panels):
        drawn = False
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                xs, ys = zip(*points)
                dense = len(points) >= 30
                line = ax.plot(xs, ys, marker=None if dense else "o", label=key, alpha=0.35 if dense else 1.0)
                if dense:  # a moving average shows the trend through per-step noise
                    window = max(5, len(ys) // 30)
                    smooth = [
                        sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1])
                        for i in range(len(ys))
                    ]
                    ax.plot(xs, smooth, color=line[0].get_color(), label=f"{key} ({window}-step mean)")
                drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(str(run_dir))
    out = Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return [out]
