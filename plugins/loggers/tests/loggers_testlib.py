"""Shared by the loggers' tests: a run to track, the steps a run logs (a whole run, directly or through
``Trackers``), and a reader of wandb's offline files."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlzoo.interfaces import TrackedRun
from rlzoo.reporting.trackers import Trackers

TAGS = {"sweep": "sw", "cell": "lr=0.001", "seed": "1", "lr": "0.001"}
EVAL_EVERY = 5


def tracked_run(tmp_path: Path, name: str = "cell/seed1", **changes: Any) -> TrackedRun:
    """A run as the core describes it to a logger: a real resolved config (a RunConfig's), sweep-like tags."""
    from rlzoo.config.schema import RunConfig

    run_dir = tmp_path / "run"
    config = RunConfig(output_dir=str(run_dir), seed=1, tracking={"group": "sw", "tags": TAGS})
    fields = {
        "run_dir": run_dir,
        "name": name,
        "group": "sw",
        "tags": dict(TAGS),
        "store_dir": tmp_path,
        "state_dir": run_dir / "loggers" / "x",
        "config": config.model_dump(mode="json"),
    }
    fields.update(changes)
    if fields.get("logged_through") is not None and "already_logged" not in changes:
        # what the core reads from metrics.jsonl: the keys the first process gave at each step it runs again
        steps = range(fields["resumed_at"], fields["logged_through"] + 1)
        fields["already_logged"] = {s: frozenset(step_metrics(s)) for s in steps}
    fields["state_dir"].mkdir(parents=True, exist_ok=True)
    return TrackedRun(**fields)


def step_metrics(step: int) -> dict[str, float]:
    """What step ``step`` logs: a loss, a reward, a metric that is NaN at step 2; evaluations every 5 steps."""
    metrics = {"loss": 1.0 / (step + 1), "reward/mean": 0.1 * step, "grad/norm": math.nan if step == 2 else float(step)}
    if step % EVAL_EVERY == 0:
        metrics["eval/accuracy"] = 0.5 + 0.01 * step
    return metrics


def log_steps(logger: Any, steps: range) -> None:
    """Call a logger (or :class:`rlzoo.reporting.trackers.Trackers`) as ``TrainingRun.run`` does for these steps."""
    for step in steps:
        metrics = step_metrics(step)
        if step % EVAL_EVERY == 0:
            logger.log_evaluation(step, {k: v for k, v in metrics.items() if k.startswith("eval/")})
        logger.log_metrics(step, metrics)


def complete(logger: Any, steps: int, artifacts: list[Path]) -> dict[str, float]:
    """The end of a run: the final evaluation at step ``steps``, then finish; returns the summary."""
    final = {"eval/accuracy": 0.9, "final": 1.0}
    logger.log_evaluation(steps, final)
    logger.log_metrics(steps, final)
    summary = {**final, "steps": float(steps)}
    logger.finish(summary, artifacts)
    return summary


def whole_run(
    logger: Any, run: TrackedRun, steps: int, artifacts: list[Path], through_trackers: bool
) -> dict[str, float]:
    """Start, log ``steps`` steps, finish and close ``logger``: called directly, or through :class:`Trackers` as a run
    calls it; returns the summary."""
    target = Trackers({"loggers.0": logger}) if through_trackers else logger
    target.start({"loggers.0": run} if through_trackers else run)
    log_steps(target, range(steps))
    summary = complete(target, steps, artifacts)
    target.close()
    return summary


# -- wandb: its offline files (.wandb) read back -------------------------------------------------------------------

BLOCK = 32768
HEADER = 7  # ":W&B", a 2-byte magic, a 1-byte version
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> Iterator[Any]:
    """Every ``Record`` in a ``.wandb`` file: LevelDB log-format blocks after a 7-byte header, each record a
    4-byte crc32, a 2-byte little-endian length, a 1-byte type (full, first, middle, last) and its payload."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb file"
    pos, parts = HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            whole = payload
        elif kind == FIRST:
            parts = payload
            continue
        elif kind == MIDDLE:
            parts += payload
            continue
        elif kind == LAST:
            whole, parts = parts + payload, b""
        else:  # zero-filled space at the end of a file
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(whole)
        yield record


def _items(items: Any) -> dict[str, Any]:
    """History, config or summary items as a dict: a nested key (``["plot", "_type"]``) as nested dicts."""
    import json

    out: dict[str, Any] = {}
    for item in items:
        *parents, last = list(item.nested_key) or [item.key]
        into = out
        for parent in parents:
            into = into.setdefault(parent, {})
        into[last] = json.loads(item.value_json)
    return out


def _wait_complete(path: Path, timeout_s: float = 15.0) -> None:
    """Wait until wandb's service has written the run's exit record: ``run.finish()`` may return before the
    service has flushed the file (seen with wandb 0.31: the header alone, for a moment)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)):
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s} s"
        time.sleep(0.05)


def read_wandb(run_dir: Path) -> list[dict[str, Any]]:
    """Each offline run folder under ``run_dir/wandb`` (oldest first) as ``{"id", "history": {step: {key: value}},
    "history_rows": [step of each history record], "config", "summary", "run", "artifacts", "exit", "folder"}``;
    values JSON-decoded. (wandb 0.31 has no reader of its own for these files.)"""

    runs = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        (path,) = folder.glob("run-*.wandb")
        _wait_complete(path)
        read: dict[str, Any] = {
            "history": {},
            "history_rows": [],
            "config": {},
            "summary": {},
            "run": None,
            "artifacts": [],
            "exit": None,
        }
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                row = _items(record.history.item)
                step = int(row.get("_step", record.history.step.num))
                read["history_rows"].append(step)
                read["history"].setdefault(step, {}).update(row)
            elif kind == "config":
                read["config"].update(_items(record.config.update))
            elif kind == "summary":
                read["summary"].update(_items(record.summary.update))
            elif kind == "run":
                read["run"] = record.run
                read["config"].update(_items(record.run.config.update))
            elif kind == "artifact":
                read["artifacts"].append(record.artifact)
            elif kind == "exit":
                read["exit"] = record.exit
        assert read["run"] is not None, f"{path} holds no run record"
        read["id"], read["folder"] = read["run"].run_id, folder
        runs.append(read)
    return runs


# -- fixtures (imported by the test modules: a conftest.py here would shadow integration_tests' own) ------------


@pytest.fixture
def artifacts(tmp_path: Path) -> list[Path]:
    """A run's artifacts: a small PNG plot (matplotlib) and its config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = tmp_path / "artifacts"
    folder.mkdir()
    fig, ax = plt.subplots(figsize=(2, 1.5), dpi=50)
    ax.plot([0, 1, 2], [0.2, 0.5, 0.9])
    plot = folder / "curves.png"
    fig.savefig(plot)
    plt.close(fig)
    config = folder / "config.yaml"
    config.write_text("seed: 1\n")
    return [plot, config]
