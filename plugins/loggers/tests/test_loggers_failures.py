"""A tracker that cannot be used (server unreachable, library missing) costs one warning; the run goes on."""

from __future__ import annotations

import logging
import os
import sys
import time

import pytest
from loggers_testlib import (
    artifacts,  # noqa: F401 (a fixture)
    complete,
    log_steps,
    tracked_run,
)

from rlzoo.reporting.trackers import Trackers, start_trackers
from rlzoo_loggers.mlflow_logger import MlflowLogger
from rlzoo_loggers.tensorboard_logger import TensorBoardLogger
from rlzoo_loggers.wandb_logger import WandbLogger

MLFLOW_ENV = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")


def warnings_of(caplog, prefix: str = "rlzoo") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(prefix)]


@pytest.fixture
def registry():
    import rlzoo_loggers.plugin
    from rlzoo.registry import Registry

    registry = Registry()
    registry.add_plugin(rlzoo_loggers.plugin, name="loggers", distribution="rlzoo-loggers")
    assert not registry.load_errors
    return registry


def test_an_unreachable_mlflow_server_fails_fast_with_one_warning(tmp_path, artifacts, caplog, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    for key in MLFLOW_ENV:
        monkeypatch.delenv(key, raising=False)
    unreachable = MlflowLogger(MlflowLogger.Params(tracking_uri="http://127.0.0.1:9"))  # the discard port: refused
    board = TensorBoardLogger()
    trackers = Trackers({"loggers.0": unreachable, "loggers.1": board})
    runs = {
        "loggers.0": tracked_run(tmp_path, state_dir=tmp_path / "run" / "loggers" / "mlflow"),
        "loggers.1": tracked_run(tmp_path, state_dir=tmp_path / "run" / "loggers" / "tensorboard"),
    }
    began = time.monotonic()
    with caplog.at_level(logging.WARNING):
        trackers.start(runs)
        took = time.monotonic() - began
        log_steps(trackers, range(4))
        complete(trackers, 4, artifacts)
        trackers.close()
    assert took < 10, f"an unreachable server took {took:.1f} s to give up on"
    (warning,) = warnings_of(caplog)
    assert "loggers.0: logger 'mlflow' failed in start" in warning and "the run goes on" in warning
    assert len(trackers) == 1  # the other logger only
    assert not any(key in os.environ for key in MLFLOW_ENV)  # MLflow's settings were changed only for its calls

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    reader.Reload()
    assert [e.step for e in reader.Scalars("loss")] == [0, 1, 2, 3]  # the other logger received everything
    assert [e.step for e in reader.Scalars("summary/steps")] == [4]
    # both loggers were given every step, as far as the core's record goes
    assert (tmp_path / "run" / "loggers" / "tensorboard" / "logged_through.json").read_text() == '{"step": 4}'
    assert not (tmp_path / "run" / "loggers" / "mlflow" / "logged_through.json").exists()


def test_a_missing_library_is_one_warning_when_the_logger_starts(tmp_path, caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    trackers = Trackers({"loggers.0": WandbLogger()})
    with caplog.at_level(logging.WARNING):
        trackers.start({"loggers.0": tracked_run(tmp_path)})
        log_steps(trackers, range(2))
        trackers.close()
    (warning,) = warnings_of(caplog)
    assert "loggers.0: logger 'wandb' failed in start (ModuleNotFoundError" in warning
    assert len(trackers) == 0


@pytest.mark.parametrize("library, logger", [("wandb", "wandb"), ("mlflow", "mlflow"), ("tensorboard", "tensorboard")])
def test_a_missing_library_is_named_with_its_extra_before_anything_starts(
    tmp_path, caplog, monkeypatch, registry, library, logger
):
    pytest.importorskip("tensorboard")
    from rlzoo.config.schema import RunConfig

    other = "tensorboard" if logger != "tensorboard" else "wandb"
    pytest.importorskip(other)
    monkeypatch.setitem(sys.modules, library, None)
    config = RunConfig(output_dir=str(tmp_path / "run"), loggers=[{"name": logger}, {"name": other}])
    with caplog.at_level(logging.WARNING):
        trackers = start_trackers(config, registry, tmp_path / "run", None)
        log_steps(trackers, range(2))
        trackers.close()
    (warning,) = warnings_of(caplog)
    assert f"loggers.0: logger '{logger}' needs the Python package '{library}'" in warning
    assert f"pip install 'rlzoo-loggers[{logger}]'" in warning
    assert len(trackers) == 1
    assert (tmp_path / "run" / "loggers" / other / "logged_through.json").is_file()
