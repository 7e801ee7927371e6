"""The three trackers through the real CLI: ``rlzoo train`` with ``loggers: [tensorboard, wandb, mlflow]`` on the
in-process engines, then ``--resume`` with more steps: each tracker holds ONE run whose steps appear once each, with
the values of ``metrics.jsonl``; ``rlzoo ablate`` groups and tags its runs (read back with MLflow's client)."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from loggers_testlib import read_wandb, wandb_records

from rlzoo.reporting.metrics_log import read_metrics

pytest.importorskip("wandb")
pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "examples" / "gspo_tiny_moe.yaml"
TINY = [
    "rollout.engine={name: hf}",
    "trainer.engine={name: torch}",
    "cold_start.steps=2",
    "cold_start.batch_size=8",
    "cold_start.examples=32",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=4",
    "train.eval_every=2",
    "train.eval_prompts=4",
    "train.checkpoint_every=2",
]
LOGGERS = "loggers=[{name: tensorboard}, {name: wandb}, {name: mlflow}]"


def rlzoo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("rlzoo")
    command = [str(script)] if script.exists() else [shutil.which("rlzoo") or "rlzoo"]
    proc = subprocess.run([*command, *args], capture_output=True, text=True, timeout=600, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and "warning" not in proc.stderr.lower(), proc.stderr[-4000:]
    return proc


def sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def scalar_steps(run_dir: Path, key: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(key)]


def keys_at(folder: Path, step: int) -> list[str]:
    """The metric keys of every history record of ``step`` in one offline run folder (a key twice: twice)."""
    (path,) = folder.glob("run-*.wandb")
    keys = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): i.value_json for i in record.history.item}
            if int(items.get("_step", record.history.step.num)) == step:
                keys += [k for k in items if not k.startswith("_")]
    return keys


def same(logged: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """The same steps in the same order, each with its value (TensorBoard keeps float32)."""
    return [s for s, _ in logged] == [s for s, _ in expected] and all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for (_, a), (_, b) in zip(logged, expected)
    )


def test_train_then_resume_logs_each_step_once_to_every_tracker(tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    common = [*TINY, f"cold_start.output_dir={tmp_path / 'cold'}", f"output_dir={run_dir}", LOGGERS]
    first = rlzoo("train", str(CONFIG), *sets(*common, "train.steps=2"), cwd=tmp_path)
    assert "  loggers    metrics.jsonl, tensorboard, wandb, mlflow" in first.stdout
    rlzoo("train", str(CONFIG), *sets(*common, "train.steps=4"), "--resume", str(run_dir), cwd=tmp_path)

    rows = read_metrics(run_dir / "metrics.jsonl")
    reward = [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r]
    assert [s for s, _ in reward] == [0, 1, 2, 3]
    accuracy = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    # step 2's row was first the final evaluation of the 2-step run; the resume ran step 2 again
    assert [s for s, _ in accuracy] == [0, 2, 4]

    # TensorBoard: the resume purged what followed its checkpoint; each step once
    assert same(scalar_steps(run_dir, "reward/mean"), reward)
    assert same(scalar_steps(run_dir, "eval/accuracy"), accuracy)

    # MLflow (the default local store in the run folder): one run, each step once
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "rlzoo"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert same(sorted((m.step, m.value) for m in history), reward)
    assert run.data.params["trainer.lr"] == "0.0002" and run.data.params["train.steps"] == "2"  # as first logged
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"curves.png", "config.yaml"} <= {Path(p).name for p in artifacts} | {
        Path(a.path).name for d in artifacts for a in client.list_artifacts(run.info.run_id, d)
    }

    # wandb offline: two offline folders (one per process start) of ONE run id, each value once over both: step 2
    # is in both, first the 2-step run's final evaluation, then the resumed training step with only its new keys
    attempts = read_wandb(run_dir)
    assert len(attempts) == 2 and attempts[0]["id"] == attempts[1]["id"]
    given = [
        (step, key)
        for attempt in attempts
        for step in set(attempt["history_rows"])
        for key in keys_at(attempt["folder"], step)
    ]
    assert len(given) == len(set(given)), sorted(given)
    assert {s for s, k in given if k == "reward/mean"} == {0, 1, 2, 3}
    assert {s for s, k in given if k == "eval/accuracy"} == {0, 2, 4}
    logged = {s: row["reward/mean"] for a in attempts for s, row in a["history"].items() if "reward/mean" in row}
    assert all(math.isclose(logged[s], v, rel_tol=1e-9) for s, v in reward)
    assert attempts[1]["summary"]["eval/accuracy"] == pytest.approx(accuracy[-1][1])


@pytest.mark.slow  # a whole sweep (tests/test_sweep.py and integration_tests/test_ablate.py run sweeps by default)
def test_ablate_groups_the_sweep_and_tags_each_run(tmp_path):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "sweep"
    rlzoo(
        "ablate",
        str(CONFIG),
        "--vary",
        "trainer.lr=0.0001,0.0002",
        "--seeds",
        "2",
        "--out",
        str(out),
        "--jobs",
        "2",
        *sets(*TINY, "train.steps=1", "loggers=[{name: mlflow}]"),
        cwd=tmp_path,
    )
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")  # one store for the sweep
    (experiment,) = [e for e in client.search_experiments() if e.name == "sweep"]
    runs = client.search_runs([experiment.experiment_id])
    tags = sorted((r.data.tags["cell"], r.data.tags["seed"]) for r in runs)
    assert tags == [("lr-0.0001", "0"), ("lr-0.0001", "1"), ("lr-0.0002", "0"), ("lr-0.0002", "1")]
    assert {r.data.tags["trainer.lr"] for r in runs} == {"0.0001", "0.0002"}
    assert {r.info.run_name for r in runs} == {f"sweep/{c}/seed{s}" for c, s in tags}
    assert all(r.info.status == "FINISHED" for r in runs)
