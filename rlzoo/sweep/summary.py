"""The ablation table: one row per cell, each metric as mean ± 95% CI over its seeds (``summary.csv``, ``.md``).

Per run (``metrics.jsonl``; keys in docs/metrics.md):

- ``final eval/accuracy`` (and each ``eval/pass@k``): the final evaluation's value; ``best eval/accuracy``: the
  highest over the run's evaluations; with an evaluation before the first update (step 0, the starting model) and
  a later one, ``initial eval/accuracy`` and ``eval/accuracy gain`` (final minus initial, per run, so the CI is
  that of a paired difference against the starting model);
- ``reward/mean (last 20%)``: the mean over the last 20% of training steps (at least one); likewise
  ``response/length_mean`` over the first and the last 20%;
- ``clip/fraction``, ``moe/flip_rate``, ``policy/entropy``: the mean over all training steps, where logged;
- ``s/step``: the mean over steps of the step's ``time/*`` phases (evaluation excluded).

Then per cell :func:`rlzoo.sweep.stats.mean_ci` over its runs (seeds). Runs are grouped into cells by the sweep's
folders (``OUT/<cell>/seed<S>``), or, for loose run folders, by their config with ``seed`` and folders left out.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlzoo.errors import RlzooError
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.sweep.grid import MANIFEST
from rlzoo.sweep.stats import mean_ci

MEAN_OVER_STEPS = ("clip/fraction", "moe/flip_rate", "policy/entropy")
LAST_FRACTION = 0.2


@dataclass
class RunRecord:
    cell: str
    run_dir: Path
    rows: list[dict[str, Any]]

    @property
    def finished(self) -> bool:
        """Ended with the final evaluation (``"final": 1.0``): only such runs enter the table."""
        return bool(self.rows) and self.rows[-1].get("final") == 1.0

    @property
    def train_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "reward/mean" in r]

    @property
    def eval_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "eval/accuracy" in r]


def run_values(run: RunRecord) -> dict[str, float]:
    """The per-run numbers of the table (see the module docstring); missing metrics are left out."""
    out: dict[str, float] = {}
    evals, train = run.eval_rows, run.train_rows
    if evals:
        out["final eval/accuracy"] = evals[-1]["eval/accuracy"]
        out["best eval/accuracy"] = max(r["eval/accuracy"] for r in evals)
        for key in sorted(k for k in evals[-1] if k.startswith("eval/pass@")):
            out[f"final {key}"] = evals[-1][key]
        if len(evals) > 1 and evals[0].get("step") == 0:
            out["initial eval/accuracy"] = evals[0]["eval/accuracy"]
            out["eval/accuracy gain"] = evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"]
    if train:
        share = max(1, math.ceil(LAST_FRACTION * len(train)))
        head, tail = train[:share], train[-share:]
        out["reward/mean (last 20%)"] = sum(r["reward/mean"] for r in tail) / len(tail)
        if all("response/length_mean" in r for r in head + tail):
            out["response/length_mean (first 20%)"] = sum(r["response/length_mean"] for r in head) / len(head)
            out["response/length_mean (last 20%)"] = sum(r["response/length_mean"] for r in tail) / len(tail)
        for key in MEAN_OVER_STEPS:
            values = [r[key] for r in train if isinstance(r.get(key), (int, float))]
            if values:
                out[key] = sum(values) / len(values)
        out["s/step"] = sum(sum(v for k, v in r.items() if k.startswith("time/")) for r in train) / len(train)
    return out


def collect(paths: list[Path]) -> list[RunRecord]:
    """Run records from sweep folders (``sweep.json``) and run folders (``metrics.jsonl``), in the order given."""
    records: list[RunRecord] = []
    loose: list[Path] = []
    for path in map(Path, paths):
        if (path / MANIFEST).is_file():
            for cell in json.loads((path / MANIFEST).read_text())["cells"]:
                for run_dir in sorted(
                    (path / cell).glob("seed*"), key=lambda p: int(p.name[4:]) if p.name[4:].isdigit() else 0
                ):
                    rows = read_metrics(run_dir / "metrics.jsonl")
                    if rows:
                        records.append(RunRecord(cell, run_dir, rows))
        elif (path / "metrics.jsonl").is_file():
            loose.append(path)
        else:
            raise RlzooError(f"{path} is neither a sweep folder ({MANIFEST}) nor a run folder (metrics.jsonl)")
    records += _group_loose(loose)
    if not records:
        raise RlzooError(f"no run with metrics in {', '.join(map(str, paths))}: nothing to summarise")
    return records


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        return {k: v for key, value in data.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: json.dumps(data)}


def _short(key: str) -> str:
    """``algorithm.ratio.name`` -> ``ratio``, ``trainer.lr`` -> ``lr``."""
    parts = key.split(".")
    return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]


def _group_loose(run_dirs: list[Path]) -> list[RunRecord]:
    """Loose run folders: same config apart from seed and folders = same cell, named by the keys that differ."""
    ignored = ("seed", "output_dir", "cold_start.output_dir", "model.path")
    flats = {}
    for run_dir in run_dirs:
        config_file = run_dir / "config.yaml"
        data = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
        flats[run_dir] = {k: v for k, v in _flat(data or {}).items() if k not in ignored}
    groups: dict[str, list[Path]] = {}
    for run_dir, flat in flats.items():
        groups.setdefault(json.dumps(flat, sort_keys=True), []).append(run_dir)
    all_keys = sorted({k for f in flats.values() for k in f})
    differing = [k for k in all_keys if len({f.get(k) for f in flats.values()}) > 1]
    records = []
    for members in groups.values():
        flat = flats[members[0]]
        label = ", ".join(f"{_short(k)}={json.loads(flat[k]) if k in flat else '-'}" for k in differing[:4])
        label = label or members[0].name
        records += [RunRecord(label, run_dir, read_metrics(run_dir / "metrics.jsonl")) for run_dir in members]
    return records


def summarise(records: list[RunRecord]) -> list[dict[str, Any]]:
    """One row per cell (in first-seen order): ``cell``, ``seeds``, and ``(mean, ci)`` per metric, over the cell's
    finished runs (an unfinished run's last evaluation is not a final one; :func:`write_tables` lists them)."""
    cells: dict[str, list[RunRecord]] = {}
    for record in (r for r in records if r.finished):
        cells.setdefault(record.cell, []).append(record)
    rows = []
    for cell, runs in cells.items():
        per_run = [run_values(r) for r in runs]
        keys = list(dict.fromkeys(k for values in per_run for k in values))
        rows.append({"cell": cell, "seeds": len(runs), **{k: mean_ci([v[k] for v in per_run if k in v]) for k in keys}})
    return rows


def _metric_keys(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row if k not in ("cell", "seeds")))


def _fmt(value: float) -> str:
    return "" if not math.isfinite(value) else f"{value:.4g}"


def write_tables(rows: list[dict[str, Any]], out_dir: Path, unfinished: list[Path] = ()) -> list[Path]:
    """``summary.csv`` (``<metric> mean`` and ``<metric> ci95`` columns) and ``summary.md`` (``mean ± ci``; and the
    ``unfinished`` runs left out)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = _metric_keys(rows)
    csv_path, md_path = out_dir / "summary.csv", out_dir / "summary.md"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["cell", "seeds", *(f"{k} {part}" for k in keys for part in ("mean", "ci95"))])
        for row in rows:
            cells = [_fmt(x) for k in keys for x in row.get(k, (math.nan, math.nan))]
            writer.writerow([row["cell"], row["seeds"], *cells])
    lines = [
        "| cell | seeds | " + " | ".join(keys) + " |",
        "|---|---:|" + "---:|" * len(keys),
    ]
    for row in rows:
        values = []
        for key in keys:
            mean, ci = row.get(key, (math.nan, math.nan))
            values.append(
                "—" if not math.isfinite(mean) else _fmt(mean) + (f" ± {_fmt(ci)}" if math.isfinite(ci) else "")
            )
        lines.append(f"| {row['cell']} | {row['seeds']} | " + " | ".join(values) + " |")
    lines += ["", "mean ± 95% confidence interval over seeds (Student t, n - 1 degrees of freedom); docs/ablation.md"]
    if unfinished:
        lines += ["", f"left out, unfinished ({len(unfinished)}): " + ", ".join(str(p) for p in unfinished)]
    md_path.write_text("\n".join(lines) + "\n")
    return [csv_path, md_path]
