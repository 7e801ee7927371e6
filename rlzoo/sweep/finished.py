"""A sweep's finished runs: kept only when their record is whole and is this sweep's run; their checkpoints dropped.

A run is *finished* when its ``metrics.jsonl`` ends with the final evaluation (``"final": 1.0``). A rerun of the
sweep keeps such a run instead of training it again, so the table it enters must be able to trust it: before
anything runs, :func:`check_finished` verifies that its ``metrics.jsonl`` holds one row for every step
``0 .. train.steps - 1`` and the final row at step ``train.steps`` (nothing lost, nothing logged twice), and that
the config it ran with (its ``config.yaml``, with any change a resume recorded; :mod:`rlzoo.preflight.resume_changes`)
is the config this sweep gives it. A run that fails either is not this sweep's result: the sweep stops with one line
per such run, and the way to redo it is to delete its folder.

``--drop-finished-checkpoints``: a finished, verified run never resumes, so its ``checkpoints/`` folder (a real
model's weights and optimizer state, gigabytes per checkpoint) is only disk used; :func:`drop_checkpoints` removes it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rlzoo.errors import RlzooError
from rlzoo.preflight.resume_changes import config_changes
from rlzoo.registry import Registry
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.sweep.grid import Run

CHECKPOINTS = "checkpoints"
SHOWN = 8  # steps or fields named in one problem line before "and N more"


def is_finished(run_dir: Path) -> bool:
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    return bool(rows) and rows[-1].get("final") == 1.0


def _listed(items: list[Any]) -> str:
    shown = ", ".join(str(item) for item in items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def metrics_problems(run_dir: Path, steps: int) -> list[str]:
    """What is wrong with a finished run's ``metrics.jsonl`` for a run of ``steps`` steps (empty: nothing)."""
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    finals = [r["step"] for r in rows if r.get("final") == 1.0]
    logged = [r["step"] for r in rows if r.get("final") != 1.0]
    problems = []
    missing = sorted(set(range(steps)) - set(logged))
    if missing:
        problems.append(f"metrics.jsonl lacks step{'s' if len(missing) > 1 else ''} {_listed(missing)}")
    repeated = sorted({s for s in logged if logged.count(s) > 1})
    if repeated:
        problems.append(f"metrics.jsonl holds step{'s' if len(repeated) > 1 else ''} {_listed(repeated)} twice")
    beyond = sorted({s for s in logged if not 0 <= s < steps})
    if beyond:
        problems.append(f"metrics.jsonl holds steps outside 0..{steps - 1}: {_listed(beyond)}")
    if finals != [steps]:
        where = ", ".join(map(str, finals))
        problems.append(f"metrics.jsonl's final evaluation is at step {where}, not once at train.steps {steps}")
    return problems


def _show(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value)


def config_problems(run: Run, registry: Registry) -> list[str]:
    """How the config a finished run ran with differs from the one this sweep gives it (empty: it does not)."""
    if not (run.run_dir / "config.yaml").is_file():
        return ["config.yaml is missing (the config the run ran with is unknown)"]
    changes = config_changes(run.run_dir, run.config, registry)
    if not changes:
        return []
    fields = list(changes)
    first, (recorded, wanted) = fields[0], changes[fields[0]]
    more = f"; also at {_listed(fields[1:])}" if len(fields) > 1 else ""
    return [
        f"config.yaml differs from this sweep's at {first} (the run's {_show(recorded)}, the sweep's "
        f"{_show(wanted)}){more}"
    ]


def finished_problems(run: Run, registry: Registry) -> list[str]:
    """Every reason a finished run cannot be kept as this sweep's result (empty: it is verified)."""
    return [*metrics_problems(run.run_dir, run.config.train.steps), *config_problems(run, registry)]


def check_finished(runs: list[Run], registry: Registry) -> None:
    """Verify finished runs before anything runs: an :class:`RlzooError` with one line per run that fails, naming
    its folder and what is wrong, and how to redo it."""
    bad = [(run, problems) for run in runs if (problems := finished_problems(run, registry))]
    if not bad:
        return
    lines = [f"  {run.run_dir}: {'; '.join(problems)}" for run, problems in bad]
    folders = " ".join(str(run.run_dir) for run, _ in bad)
    raise RlzooError(
        f"{len(bad)} finished run(s) of this sweep cannot be kept as its results (nothing was run):\n"
        + "\n".join(lines)
        + f"\n  to run them again, delete their folders (rm -r {folders}) and rerun the same command"
    )


def drop_checkpoints(run_dir: Path) -> bool:
    """Remove a finished run's ``checkpoints/`` folder; whether there was one."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return False
    shutil.rmtree(folder)
    return True
