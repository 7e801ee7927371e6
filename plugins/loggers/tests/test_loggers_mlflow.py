"""The mlflow logger, read back with ``MlflowClient`` from its default local store (sqlite)."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
from loggers_testlib import (
    TAGS,
    artifacts,  # noqa: F401 (a fixture)
    log_steps,
    step_metrics,
    tracked_run,
    whole_run,
)

from rlzoo_loggers.common import flatten, read_state
from rlzoo_loggers.mlflow_logger import MlflowLogger

pytest.importorskip("mlflow")
pytest.importorskip("sqlalchemy")

STEPS = 6


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow database with its tables made (MLflow's migrations take seconds), copied by the tests that do
    not test making it."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def client(store_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{store_dir / 'mlflow.db'}")


def history(mlflow, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in mlflow.get_metric_history(run_id, key))


def tracked(tmp_path: Path, **changes):
    return tracked_run(tmp_path, state_dir=tmp_path / "run" / "loggers" / "mlflow", **changes)


@pytest.mark.parametrize("through_trackers", [False, True])
def test_params_tags_metrics_summary_and_artifacts(tmp_path, artifacts, through_trackers, empty_store):
    if through_trackers:  # the other case makes the store itself
        shutil.copy(empty_store, tmp_path / "mlflow.db")
    run = tracked(tmp_path)
    logger = MlflowLogger()
    summary = whole_run(logger, run, STEPS, artifacts, through_trackers)

    mlflow = client(tmp_path)  # the default store: sqlite in tracking.store_dir
    state = read_state(run.state_dir)
    assert state["run_id"] == logger.run_id and state["tracking_uri"] == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    found = mlflow.get_run(logger.run_id)
    assert found.info.status == "FINISHED" and found.info.run_name == "cell/seed1"
    assert mlflow.get_experiment(found.info.experiment_id).name == "sw"  # the run's group
    experiment = mlflow.get_experiment(found.info.experiment_id)
    assert experiment.artifact_location == (tmp_path.resolve() / "mlflow-artifacts").as_uri()
    assert {k: found.data.tags[k] for k in TAGS} == TAGS
    assert found.data.tags["rlzoo.run_dir"] == str(run.run_dir.resolve())

    params = found.data.params
    assert params["seed"] == "1" and params["output_dir"] == str(run.run_dir)
    assert params["tracking.tags.cell"] == TAGS["cell"] and params["tracking.group"] == "sw"
    assert params["model.path"] == "null"  # not text: as JSON
    assert params["loggers"] == "[]" and params["task.name"] == run.config["task"]["name"]
    assert len(params) == len(flatten(run.config))

    steps = list(range(STEPS))
    assert history(mlflow, logger.run_id, "loss") == [(s, pytest.approx(1.0 / (s + 1))) for s in steps]
    assert history(mlflow, logger.run_id, "reward/mean") == [(s, pytest.approx(0.1 * s)) for s in steps]
    assert history(mlflow, logger.run_id, "grad/norm") == [(s, float(s)) for s in steps if s != 2]  # NaN left out
    assert history(mlflow, logger.run_id, "eval/accuracy") == [(0, 0.5), (5, pytest.approx(0.55)), (STEPS, 0.9)]
    assert history(mlflow, logger.run_id, "final") == [(STEPS, 1.0)]  # logged once, at its step
    assert history(mlflow, logger.run_id, "steps") == [(STEPS, float(STEPS))]  # the summary's own value

    listed = {a.path for a in mlflow.list_artifacts(logger.run_id)}
    assert listed == {"summary.json", "curves.png", "config.yaml"}
    local = Path(mlflow.download_artifacts(logger.run_id, "summary.json", str(tmp_path / "dl")))
    assert json.loads(local.read_text()) == summary
    assert (tmp_path / "mlflow-artifacts").is_dir()


def test_resume_reopens_the_run_and_logs_each_step_once(tmp_path, artifacts, empty_store):
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    first = MlflowLogger()
    first.start(tracked(tmp_path))
    log_steps(first, range(8))
    first.close()  # killed after step 7: no finish
    mlflow = client(tmp_path)
    assert mlflow.get_run(first.run_id).info.status == "KILLED"

    second = MlflowLogger()
    second.start(tracked(tmp_path, resumed_at=5, logged_through=7))
    assert second.run_id == first.run_id
    assert mlflow.get_run(first.run_id).info.status == "RUNNING"
    log_steps(second, range(5, 10))
    second.finish({"steps": 10.0}, artifacts)
    second.close()

    (only,) = mlflow.search_runs([mlflow.get_experiment_by_name("sw").experiment_id])
    assert only.info.run_id == first.run_id and only.info.status == "FINISHED"
    assert history(mlflow, first.run_id, "loss") == [(s, pytest.approx(step_metrics(s)["loss"])) for s in range(10)]
    assert history(mlflow, first.run_id, "steps") == [(9, 10.0)]


def test_resume_of_a_run_no_longer_in_the_store_starts_a_new_one(tmp_path, empty_store, caplog):
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    first = MlflowLogger()
    first.start(tracked(tmp_path))
    first.close()
    shutil.copy(empty_store, tmp_path / "mlflow.db")  # the store replaced by an empty one
    second = MlflowLogger()
    with caplog.at_level(logging.WARNING, logger="rlzoo_loggers"):
        second.start(tracked(tmp_path, resumed_at=3, logged_through=4))
    log_steps(second, range(3, 5))
    second.close()
    assert second.run_id != first.run_id
    assert [r.name for r in caplog.records] == ["rlzoo_loggers.mlflow_logger"]
    assert first.run_id in caplog.text and "starting a new MLflow run" in caplog.text
    mlflow = client(tmp_path)
    found = mlflow.get_run(second.run_id)
    assert found.data.params["seed"] == "1"  # a new run: its params logged
    # it holds none of the earlier steps, so it is given every step from the checkpoint on
    assert [s for s, _ in history(mlflow, second.run_id, "loss")] == [3, 4]


def test_long_values_and_non_finite_metrics(tmp_path, empty_store):
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    many = {f"k{i}": i for i in range(250)}  # three log_batch requests of params (100 at most each)
    config = {"prompt": {"system": "x" * (MAX_PARAM_VAL_LENGTH + 500)}, "empty": {}, "many": many}
    run = tracked(tmp_path, config=config)
    logger = MlflowLogger(MlflowLogger.Params(experiment="mine"))
    logger.start(run)
    logger.log_metrics(0, {"a": math.inf, "b": math.nan, "c": 2.0})
    logger.close()
    mlflow = client(tmp_path)
    found = mlflow.get_run(logger.run_id)
    assert found.data.params == {
        "prompt.system": "x" * MAX_PARAM_VAL_LENGTH,
        "empty": "{}",
        **{f"many.k{i}": str(i) for i in range(250)},
    }
    assert found.data.metrics == {"c": 2.0}
    assert mlflow.get_experiment(found.info.experiment_id).name == "mine"


def test_a_sweeps_runs_share_one_new_store_at_once(tmp_path):
    """``rlzoo ablate --jobs N``: several processes open the sweep folder's store when it does not exist yet."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from rlzoo.interfaces import TrackedRun\n"
        "from rlzoo_loggers.mlflow_logger import MlflowLogger\n"
        "store, i = Path(sys.argv[1]), sys.argv[2]\n"
        "run = TrackedRun(run_dir=store / i, name=f'seed{i}', group='sw', tags={'seed': i}, store_dir=store,\n"
        "                 state_dir=store / i / 'loggers' / 'mlflow', config={'seed': int(i)})\n"
        "logger = MlflowLogger()\n"
        "logger.start(run)\n"
        "for step in range(3):\n"
        "    logger.log_metrics(step, {'loss': 1.0 / (step + 1)})\n"
        "logger.finish({'steps': 3.0}, []); logger.close()\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(i)], stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
    mlflow = client(tmp_path)
    runs = mlflow.search_runs([mlflow.get_experiment_by_name("sw").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["seed0", "seed1"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.params["seed"] for r in runs} == {"0", "1"}
