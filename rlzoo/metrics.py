"""Metrics: one JSON object per line in ``metrics.jsonl`` (and to the configured experiment trackers, :mod:`rlzoo.tracking`).

A metric value is a float. How it combines over a step's minibatches and over the ranks of a multi-process run is
declared where it is produced, by the value's class (docs/metrics.md, "Reporting metrics";
:func:`reduce_minibatches`, :func:`reduce_ranks`):

- :class:`Mean`, or a plain float: the mean of the finite values over minibatches, the mean over ranks;
- :class:`Sum`: the sum over minibatches, the mean over ranks (each rank's value is about the whole batch);
- :class:`Min` / :class:`Max`: the minimum / maximum over both.

:class:`SkippedUpdates` and :class:`UnscoredResponses` are sums that also declare a fault, which
:class:`rlzoo.faults.FaultPolicy` reads by class, whatever the key. Any component reports its own metrics with
``self.report(name, value)`` (:meth:`rlzoo.interfaces.Component.report`); the core collects them with
:func:`take_reports`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from rlzoo.interfaces.base import Component

log = logging.getLogger(__name__)


class Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _finite_mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


#: the reductions a metric class may declare, by name
REDUCERS: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": _mean,
    "finite_mean": _finite_mean,
    "sum": lambda values: float(sum(values)),
    "min": min,
    "max": max,
}


class Declared(float):
    """A metric value that declares how it combines: a float everywhere (JSON, comparisons, TensorBoard), whose
    class names its reduction over a step's minibatches (``over_minibatches``) and over ranks (``over_ranks``),
    both keys of :data:`REDUCERS`. Arithmetic on it gives a plain float: the reductions put the class back."""

    __slots__ = ()
    over_minibatches: ClassVar[str]
    over_ranks: ClassVar[str]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({float(self)!r})"


class Mean(Declared):
    """Averaged: over minibatches the mean of the finite values (NaN if none is), over ranks the mean. A plain
    float means the same; this class only says so explicitly."""

    over_minibatches = "finite_mean"
    over_ranks = "mean"


class Sum(Declared):
    """A count: summed over a step's minibatches (and its generation batches, and the ranks' shares of scoring).

    Over ranks the mean, not the sum: every metric a step returns is already about the whole batch on every rank
    (the learner gives each loss the whole minibatch, and rollout metrics are gathered before they are counted),
    so the ranks hold the same count and summing would multiply it by the world size."""

    over_minibatches = "sum"
    over_ranks = "mean"


class Min(Declared):
    """An extreme: the minimum over minibatches and over ranks (e.g. ``ratio/min``)."""

    over_minibatches = "min"
    over_ranks = "min"


class Max(Declared):
    """An extreme: the maximum over minibatches and over ranks (e.g. ``ratio/max``)."""

    over_minibatches = "max"
    over_ranks = "max"


class SkippedUpdates(Sum):
    """Updates the training engine skipped because the loss or gradient norm was not finite (a fault:
    :class:`rlzoo.faults.FaultPolicy` fails a step with any)."""


class UnscoredResponses(Sum):
    """Responses the verifier could not score (it raised, timed out or gave a non-finite reward): they scored 0
    (a fault: :class:`rlzoo.faults.FaultPolicy` fails a step in which none of the responses was scored)."""


def declared(value: float) -> type[Declared]:
    """The reduction class of a metric value: its own, or :class:`Mean` for a plain number."""
    return type(value) if isinstance(value, Declared) else Mean


def _reduce(values: Sequence[float], over: str) -> float:
    kind = declared(values[0])  # the first producer's declaration
    value = REDUCERS[getattr(kind, over)](values)
    return kind(value) if isinstance(values[0], Declared) else value


def reduce_minibatches(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Combine the metrics of the parts of one step, per key by the value's declared reduction over minibatches
    (``over_minibatches``), keeping its class: the step's minibatch updates, and also its generation batches and
    the ranks' shares of scoring. A plain float is a :class:`Mean` (the mean of its finite values)."""
    keys = dict.fromkeys(k for part in parts for k in part)  # first-seen order
    return {key: _reduce([part[key] for part in parts if key in part], "over_minibatches") for key in keys}


def reduce_ranks(everyone: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Combine every rank's step metrics (``everyone[r]`` is rank r's), per key by the value's declared reduction
    over ranks (``over_ranks``), keeping its class; ``time/*`` are rank 0's."""
    out = dict(everyone[0])
    for key in dict.fromkeys(k for metrics in everyone for k in metrics):
        if not key.startswith("time/"):
            out[key] = _reduce([m[key] for m in everyone if key in m], "over_ranks")
    return out


def take_reports(component: Component) -> dict[str, float]:
    """The metrics ``component`` reported since the last call (:meth:`~rlzoo.interfaces.Component.report`), keyed
    ``<namespace>/<name>/<metric>``, and its buffer cleared.

    ``<namespace>`` is the kind's ``metric_namespace`` (its ``kind`` if it declares none), ``<name>`` the
    component's registered name: the name keeps two components of one kind in a run (two reward shapers, two
    regularisers) from writing the same key, and says which component a key came from."""
    reports = component.__dict__.pop("_metric_reports", None)
    if not reports:
        return {}
    prefix = f"{component.metric_namespace or component.kind}/{component.name}"
    return {f"{prefix}/{metric}": value for metric, value in reports.items()}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``, skipping the lines that are not a whole JSON object.

    A torn *last* line is what a crash in the middle of a write leaves: it is skipped quietly (a debug record; a
    resumed run rewrites the file without it). A bad line with rows after it is not expected: it is skipped with a
    warning naming the file and its 1-based line, and the rows after it are used."""
    path = Path(path)
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    last = 0  # the last non-blank line
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        last = number
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(number)
    for number in bad:
        if number == last:
            log.debug("%s, line %d: cut short (a write interrupted by a crash); skipped", path, number)
        else:
            log.warning("%s, line %d: not a whole JSON object (a torn or corrupted write); skipped, the other "
                        "lines are used", path, number)
    return rows


class MetricsLogger:
    """``metrics.jsonl``: every step's metrics, one JSON object per line (always written; experiment trackers are
    the ``loggers`` components, :mod:`rlzoo.tracking`)."""

    def __init__(self, run_dir: Path, keep_below_step: int | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        if keep_below_step is not None:
            # on resume, drop what was logged after the checkpoint: those steps are run again
            rows = [r for r in read_metrics(self.path) if r.get("step", 0) < keep_below_step]
            from rlzoo.checkpoint import atomic_write_text  # a kill while rewriting must not lose the log

            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: metrics[k] for k in sorted(metrics)}}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()

    def close(self) -> None:
        pass


class NullMetricsLogger:
    """What the ranks other than 0 of a multi-process run log to: nothing."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
