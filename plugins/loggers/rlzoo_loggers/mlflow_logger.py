"""The ``mlflow`` logger: an MLflow run, in a local store shared by a sweep's runs or on a tracking server."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Logger, Params, TrackedRun
from rlzoo_loggers.common import as_text, finite, flatten, plain, read_state, write_state

log = logging.getLogger(__name__)

#: the local store's database and artifact folder, in ``tracking.store_dir`` (default: the run folder)
DATABASE = "mlflow.db"
ARTIFACTS = "mlflow-artifacts"


@rlzoo.register("logger", "mlflow")
class MlflowLogger(Logger):
    """Record the run as an MLflow run: params (the flattened config), tags, metrics per step, summary, files.

    Uses ``mlflow.tracking.MlflowClient`` on ``tracking_uri`` (never MLflow's global "active run" state). The
    default store is local: ``sqlite:///<store_dir>/mlflow.db`` with artifacts in ``<store_dir>/mlflow-artifacts``
    (``tracking.store_dir``: the run folder, or a sweep's folder, which its runs share: ``mlflow ui
    --backend-store-uri sqlite:///<store_dir>/mlflow.db``); MLflow 3 no longer takes a plain ``./mlruns`` folder.
    The experiment is ``experiment``, else the run's group, else ``rlzoo``; the run's name is the run's name and
    its tags are the run's tags plus ``rlzoo.run_dir``.

    At the tracker run's creation: the config flattened to dotted keys (``algorithm.clipper.eps``, list items by
    index) as params, values as text within MLflow's length limits, sent with ``log_batch`` in chunks of MLflow's
    per-request limit. Each step: the finite metrics with ``log_batch`` at that step (NaN and infinities are left
    out). Finish: the summary's values not already logged at the last step as metrics there, the summary as
    ``summary.json`` and the artifact files as run artifacts; status ``FINISHED``. Closed without finishing (a
    crash, an interrupt): status ``KILLED``.

    Resume: the run id is kept in ``loggers/mlflow/run.json``; a resumed process reopens that run (status back to
    ``RUNNING``) and logs of the steps it runs again only what it does not hold yet (:meth:`TrackedRun.unlogged`),
    so each value is logged once. If that run is gone (a deleted store), a warning, and a new run. A server that cannot be
    reached fails within seconds: this logger's calls use at most ``http_retries`` retries, 1 s of backoff factor
    and ``http_timeout_s`` per request (MLflow's ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``..._BACKOFF_FACTOR`` and
    ``..._TIMEOUT``, set only during them; MLflow's own defaults retry for minutes).
    Reference: mlflow.tracking.MlflowClient (create_run, log_batch, log_artifact, set_terminated).
    """

    reference = "MLflow tracking: mlflow.tracking.MlflowClient (log_batch, log_artifact, set_terminated)"
    requires = ("mlflow",)
    install_hint = "pip install 'rlzoo-loggers[mlflow]'"

    class Params(Params):
        tracking_uri: str | None = Field(
            None, description="an MLflow tracking server or store URI; null: sqlite:///<tracking.store_dir>/mlflow.db"
        )
        experiment: str | None = Field(None, description="the MLflow experiment; null: tracking.group, else 'rlzoo'")
        http_retries: int = Field(2, ge=0, le=10, description="retries of a failed request to a tracking server")
        http_timeout_s: int = Field(10, ge=1, le=600, description="time limit of one request to a tracking server")

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        self._client: Any = None
        self._resumed: TrackedRun | None = None  # a resumed run's record of what this tracker holds
        self._last_step: int | None = None
        self._last_keys: set[str] = set()
        self._finished = False
        self.run_id: str | None = None
        self.tracking_uri: str | None = None

    @contextlib.contextmanager
    def _limits(self) -> Iterator[None]:
        """MLflow's HTTP retry and timeout settings, for this logger's own calls only."""
        changes = {
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(self.params.http_retries),
            "MLFLOW_HTTP_REQUEST_TIMEOUT": str(self.params.http_timeout_s),
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",  # waits of 0, 2, 4... s between retries (MLflow's: 0, 4, 8...)
        }
        before = {key: os.environ.get(key) for key in changes}
        os.environ.update(changes)
        try:
            yield
        finally:
            for key, value in before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def start(self, run: TrackedRun) -> None:
        from mlflow.tracking import MlflowClient

        store_dir = Path(run.store_dir).resolve()
        local = self.params.tracking_uri is None
        if local:
            _needs_sql_store()
            store_dir.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = self.params.tracking_uri or f"sqlite:///{store_dir / DATABASE}"
        name = self.params.experiment or run.group or "rlzoo"
        with self._limits(), _file_lock(store_dir / f"{DATABASE}.lock") if local else contextlib.nullcontext():
            # the lock: the runs of a sweep share one database; the client makes its tables (MLflow's migrations)
            # when it is new, and two processes doing that at once break it
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
            experiment_id = self._experiment(name, (store_dir / ARTIFACTS).as_uri() if local else None)
            state = read_state(run.state_dir) if run.resumed_at is not None else {}
            reopened = self._reopen(state.get("run_id"))
            if reopened:
                self.run_id = state["run_id"]
            else:
                self.run_id = self._create(run, experiment_id)
        state = {"run_id": self.run_id, "tracking_uri": self.tracking_uri, "experiment_id": experiment_id}
        write_state(run.state_dir, state)
        self._resumed = run if reopened else None  # a new tracker run holds nothing yet

    def _experiment(self, name: str, artifact_location: str | None) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self._client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self._client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException:  # created meanwhile by another run of the sweep
            experiment = self._client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def _reopen(self, run_id: str | None) -> bool:
        from mlflow.exceptions import MlflowException

        if not run_id:
            return False
        try:
            found = self._client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":  # e.g. a server out of reach: the logger fails
                raise
            log.warning(
                "mlflow: the run %s this run logged to is not in %s (%s); starting a new MLflow run",
                run_id,
                self.tracking_uri,
                exc,
            )
            return False
        if found.info.lifecycle_stage == "deleted":
            log.warning(
                "mlflow: the run %s this run logged to was deleted in %s; starting a new MLflow run",
                run_id,
                self.tracking_uri,
            )
            return False
        self._client.update_run(run_id, status="RUNNING")
        return True

    def _create(self, run: TrackedRun, experiment_id: str) -> str:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

        tags = {str(k)[:MAX_ENTITY_KEY_LENGTH]: str(v)[:MAX_TAG_VAL_LENGTH] for k, v in run.tags.items()}
        tags["rlzoo.run_dir"] = str(Path(run.run_dir).resolve())
        created = self._client.create_run(experiment_id, run_name=run.name, tags=tags)
        params = {
            key[:MAX_ENTITY_KEY_LENGTH]: as_text(value)[:MAX_PARAM_VAL_LENGTH]
            for key, value in flatten(plain(run.config)).items()
        }
        self._batch(created.info.run_id, params=[Param(k, v) for k, v in params.items()])
        return created.info.run_id

    def _batch(self, run_id: str, metrics: Sequence[Any] = (), params: Sequence[Any] = ()) -> None:
        """``log_batch`` in chunks within MLflow's limits per request."""
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH

        for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(run_id, params=list(params[i : i + MAX_PARAMS_TAGS_PER_BATCH]))
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self._client.log_batch(run_id, metrics=list(metrics[i : i + MAX_METRICS_PER_BATCH]))

    def _metrics(self, step: int, metrics: Mapping[str, float]) -> list[Any]:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        return [Metric(key, float(value), now, step) for key, value in metrics.items() if finite(value)]

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._resumed is not None:  # what the earlier process gave it: the same values again
            metrics = self._resumed.unlogged(step, metrics)
            if not metrics:
                return
        with self._limits():
            self._batch(self.run_id, metrics=self._metrics(step, metrics))
        if step != self._last_step:
            self._last_keys = set()
        self._last_step = step
        self._last_keys |= set(metrics)

    def finish(self, summary: Mapping[str, float], artifacts: Sequence[Path]) -> None:
        step = self._last_step if self._last_step is not None else int(summary.get("steps", 0))
        new = {k: v for k, v in summary.items() if not (step == self._last_step and k in self._last_keys)}
        with self._limits():
            self._batch(self.run_id, metrics=self._metrics(step, new))
            self._client.log_dict(self.run_id, {k: float(v) for k, v in summary.items()}, "summary.json")
            for path in artifacts:
                self._client.log_artifact(self.run_id, str(path))
            self._client.set_terminated(self.run_id, "FINISHED")
        self._finished = True

    def close(self) -> None:
        if self._client is not None and self.run_id is not None and not self._finished:
            with self._limits():
                self._client.set_terminated(self.run_id, "KILLED")  # it did not complete
        self._client = None


def _needs_sql_store() -> None:
    """The default local store is a SQLite database: MLflow needs SQLAlchemy and Alembic for it."""
    import importlib.util

    missing = [p for p in ("sqlalchemy", "alembic") if importlib.util.find_spec(p) is None]
    if missing:
        raise ImportError(
            f"the default MLflow store (sqlite) needs {' and '.join(missing)}: pip install 'rlzoo-loggers[mlflow]', "
            "or set tracking_uri to a tracking server"
        )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` between processes (where the platform has ``fcntl``; else none)."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; a sweep's runs rarely create the store at the same instant
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
