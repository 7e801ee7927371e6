"""How a metric combines over minibatches and ranks, declared by its value's class (docs/metrics.md, "Reporting metrics").

- :class:`Mean`, or a plain float: the mean of the finite values over minibatches, the mean over ranks;
- :class:`Sum`: the sum over minibatches, the mean over ranks (each rank's value is about the whole batch);
- :class:`Min` / :class:`Max`: the minimum / maximum over both.

:class:`SkippedUpdates`, :class:`UnscoredResponses` and :class:`FailedEpisodes` are sums that also declare a fault,
which :class:`rlzoo.runtime.faults.FaultPolicy` reads by class, whatever the key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar


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
    :class:`rlzoo.runtime.faults.FaultPolicy` fails a step with any)."""


class UnscoredResponses(Sum):
    """Responses the verifier could not score (it raised, timed out or gave a non-finite reward): they scored 0
    (a fault: :class:`rlzoo.runtime.faults.FaultPolicy` fails a step in which none of the responses was scored)."""


class FailedEpisodes(Sum):
    """Episodes whose environment raised (in ``reset`` or ``step``) or answered with something not an observation:
    each ended there with reward 0 (a fault: :class:`rlzoo.runtime.faults.FaultPolicy` fails a step in which every
    episode failed)."""


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
