"""Loggers: experiment trackers that receive what a run records (``loggers: [...]`` in the config, several at once).

``metrics.jsonl`` in the run folder is always written by the core (``rlzoo plot``, ``rlzoo compare`` and resume read
it); a logger mirrors the same records to a tracker. Only the main process of a multi-process run logs. The core
calls, in order:

- :meth:`Logger.start` once per process start, with a :class:`TrackedRun`: the resolved config (the run's
  hyperparameters), its name, group and tags, and on resume the step it resumes from;
- :meth:`Logger.log_metrics` after every step with that step's metrics (``eval/*`` included on evaluation steps),
  and :meth:`Logger.log_evaluation` with each evaluation's metrics alone;
- :meth:`Logger.finish` once the last step is done, with the run's final summary and its artifacts (the curves
  plot, the config);
- :meth:`Logger.close` always, also after a crash or an interrupt (then without ``finish``).

A logger that raises is reported once as a warning naming it and is not called again; the run and the other
loggers go on (:mod:`rlzoo.reporting.trackers`). Resume: the steps after the checkpoint are run again and logged again
(exactly the same values, since a resume is exact); a tracker that can replace them does (TensorBoard's
``purge_step``), one that cannot logs only what it does not hold yet (:meth:`TrackedRun.unlogged`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo.interfaces.base import Component


@dataclass(frozen=True)
class TrackedRun:
    """What a logger knows about the run it records."""

    #: the run folder (``output_dir``)
    run_dir: Path
    #: the run's name in a tracker (``tracking.name``; default: the run folder's name)
    name: str
    #: the group of runs it belongs to (``tracking.group``; ``rlzoo ablate``: the sweep's folder name), or None
    group: str | None
    #: labels (``tracking.tags``; ``rlzoo ablate``: ``cell``, ``seed`` and each varied value)
    tags: Mapping[str, str]
    #: where a tracker keeps a local store that several runs may share (``tracking.store_dir``; default the run
    #: folder; ``rlzoo ablate``: the sweep folder)
    store_dir: Path
    #: this logger's own folder inside the run folder (``loggers/<name>``), kept across a resume: e.g. the
    #: tracker's run id, so a resumed run continues the same tracker run
    state_dir: Path
    #: the resolved config as nested plain data: the run's hyperparameters
    config: Mapping[str, Any]
    #: on resume, the completed steps of the checkpoint resumed from (the first step run again); None on a fresh start
    resumed_at: int | None = None
    #: on resume, the last step this logger was given before the process stopped (it may hold steps up to it);
    #: None if it was given none
    logged_through: int | None = None
    #: on resume, the metric keys this logger was given at each step from ``resumed_at`` to ``logged_through``
    #: (those steps run again; :meth:`unlogged` drops what it already holds)
    already_logged: Mapping[int, frozenset[str]] = field(default_factory=dict)

    def unlogged(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """The metrics of ``step`` this logger was not given before the resume: for a tracker that cannot overwrite
        a value. A step that ended the run before (its final evaluation) and is now a training step keeps its new
        keys. The values skipped are the same ones again, since a resume is exact."""
        held = self.already_logged.get(step, frozenset())
        return {key: value for key, value in metrics.items() if key not in held}


class Logger(Component):
    """Mirror a run's hyperparameters, metrics, evaluations, summary and artifacts to an experiment tracker."""

    kind = "logger"

    def start(self, run: TrackedRun) -> None:
        """Open (or, on resume, reopen) the tracker's run and record the hyperparameters ``run.config``."""
        raise NotImplementedError

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record one step's metrics (floats; non-finite values included, for the tracker to keep or drop)."""
        raise NotImplementedError

    def log_evaluation(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record an evaluation's metrics (``eval/*``) at ``step``. They are part of that step's
        :meth:`log_metrics` too; the default does nothing more. A tracker with a place for evaluations (a table, a
        separate series) overrides this."""

    def finish(self, summary: Mapping[str, float], artifacts: Sequence[Path]) -> None:
        """The run completed: record its final ``summary`` (the last evaluation and the step count) and upload
        ``artifacts`` (files: the curves plot, the config)."""

    def close(self) -> None:
        """Release the tracker (flush, end its run). Called once, also when the run failed or was interrupted."""
