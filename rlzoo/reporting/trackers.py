"""The run's loggers (``loggers: [...]``), called as one: a tracker that fails never stops the run.

Each call goes to every configured :class:`rlzoo.interfaces.Logger` that has not failed. A logger that raises
(its package missing, a server unreachable, a full disk) is reported once, as a warning naming it and the error,
and dropped; ``metrics.jsonl`` (the core's own log, :class:`rlzoo.reporting.metrics_log.MetricsLogger`) holds everything anyway.

Per logger, ``<run dir>/loggers/<name>/`` is its own folder and ``logged_through.json`` there the last step it was
given, so that a resumed run can tell it what it may already hold (:attr:`TrackedRun.logged_through`,
:attr:`TrackedRun.already_logged`, read from the rows of ``metrics.jsonl`` that the resume drops).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlzoo.interfaces.logger import Logger, TrackedRun
from rlzoo.preflight.packages import missing_package
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.util.atomic import atomic_write_text

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig
    from rlzoo.registry import Registry

log = logging.getLogger(__name__)

LOGGED_THROUGH = "logged_through.json"


class Trackers:
    """Every configured logger behind one call each; failures are warned about once and the logger dropped."""

    def __init__(self, loggers: Mapping[str, Logger]) -> None:
        self._loggers = dict(loggers)  # config field (loggers.0) -> logger
        self._state_dirs: dict[str, Path] = {}

    def start(self, runs: Mapping[str, TrackedRun]) -> None:
        for at, run in runs.items():
            self._state_dirs[at] = run.state_dir
            self._call(at, "start", lambda logger, run=run: logger.start(run))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for at in list(self._loggers):
            if self._call(at, "log_metrics", lambda logger: logger.log_metrics(step, metrics)):
                atomic_write_text(self._state_dirs[at] / LOGGED_THROUGH, json.dumps({"step": step}))

    def log_evaluation(self, step: int, metrics: Mapping[str, float]) -> None:
        for at in list(self._loggers):
            self._call(at, "log_evaluation", lambda logger: logger.log_evaluation(step, metrics))

    def finish(self, summary: Mapping[str, float], artifacts: Sequence[Path]) -> None:
        for at in list(self._loggers):
            self._call(at, "finish", lambda logger: logger.finish(summary, artifacts))

    def close(self) -> None:
        for at in list(self._loggers):
            self._call(at, "close", lambda logger: logger.close())

    def __len__(self) -> int:
        return len(self._loggers)

    def _call(self, at: str, what: str, call: Callable[[Logger], Any]) -> bool:
        logger = self._loggers.get(at)
        if logger is None:
            return False
        try:
            call(logger)
            return True
        except Exception as exc:  # a tracker's failure is the tracker's, never the run's
            del self._loggers[at]
            log.warning(
                "%s: logger %r failed in %s (%s: %s); the run goes on without it (metrics.jsonl has every step)",
                at,
                logger.name,
                what,
                type(exc).__name__,
                exc,
            )
            if what != "close":
                try:
                    logger.close()
                except Exception:  # already reported; a half-open tracker may fail to close as well
                    pass
            return False


def tracked_runs(
    config: RunConfig, run_dir: Path, resumed_at: int | None, loggers: Mapping[str, Logger]
) -> dict[str, TrackedRun]:
    """Each logger's view of the run, keyed by config field; creates the loggers' folders. On resume, call it
    before ``metrics.jsonl`` drops the rows after the checkpoint: they say what each logger was given."""
    tracking = config.tracking
    hyperparameters = config.model_dump(mode="json")
    replayed = [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if r.get("step", -1) >= (resumed_at or 0)]
    runs = {}
    for at, logger in loggers.items():
        state_dir = Path(run_dir) / "loggers" / logger.name
        state_dir.mkdir(parents=True, exist_ok=True)
        through = _logged_through(state_dir) if resumed_at is not None else None
        given: dict[int, frozenset[str]] = {}
        for row in replayed if through is not None else []:
            if row["step"] <= through:
                given[row["step"]] = given.get(row["step"], frozenset()) | {k for k in row if k != "step"}
        runs[at] = TrackedRun(
            run_dir=Path(run_dir),
            name=tracking.name or Path(run_dir).resolve().name,
            group=tracking.group,
            tags=dict(tracking.tags),
            store_dir=Path(tracking.store_dir) if tracking.store_dir else Path(run_dir),
            state_dir=state_dir,
            config=hyperparameters,
            resumed_at=resumed_at,
            logged_through=through,
            already_logged=given,
        )
    return runs


def _logged_through(state_dir: Path) -> int | None:
    try:
        return int(json.loads((state_dir / LOGGED_THROUGH).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def start_trackers(config: RunConfig, registry: Registry, run_dir: Path, resumed_at: int | None) -> Trackers:
    """The configured loggers, started; one that cannot be built or started is warned about and left out."""
    loggers: dict[str, Logger] = {}
    for i, spec in enumerate(config.loggers):
        at = f"loggers.{i}"
        package = missing_package(registry, "logger", spec.name)
        if package is not None:
            hint = registry.get("logger", spec.name).cls.install_hint
            log.warning(
                "%s: logger %r needs the Python package %r, which is not installed (%s); the run goes on without it",
                at,
                spec.name,
                package,
                hint or f"pip install {package}",
            )
            continue
        try:
            loggers[at] = registry.create("logger", spec.name, spec.params, loc=at)
        except Exception as exc:  # the config check validated it; this is the set-up itself failing
            log.warning("%s: logger %r could not be set up (%s); the run goes on without it", at, spec.name, exc)
    trackers = Trackers(loggers)
    trackers.start(tracked_runs(config, run_dir, resumed_at, loggers))
    return trackers


def run_artifacts(run_dir: Path) -> list[Path]:
    """What a finished run hands its trackers: the config and the curves plot (when it can be drawn)."""
    from rlzoo.reporting.plot import plot_run  # matplotlib, only when a run with trackers ends

    files = [run_dir / "config.yaml"]
    try:
        files += plot_run(run_dir)
    except Exception as exc:  # a plot is a courtesy to the trackers; the run is complete without it
        log.warning("could not plot the run's curves for the loggers: %s: %s", type(exc).__name__, exc)
    return [f for f in files if f.is_file()]
