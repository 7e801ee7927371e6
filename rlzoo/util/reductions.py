"""How a metric combines over minibatches and ranks, declared by its value's class (docs/metrics.md, "Reporting metrics").

- :class:`Mean`, or a plain float: the mean of the finite values over minibatches, the mean over ranks;
- :class:`Sum`: the sum over minibatches, the mean over ranks (each rank's value is about the whole batch);
- :class:`Min` / :class:`Max`: the minimum / maximum over both.

:class:`SkippedUpdates`, :class:`UnscoredResponses` and :class:`FailedEpisodes` are sums that also declare a fault,
which :class:`rlzoo.runtime.faults.FaultPolicy` reads by class, whatever the key.

A value may still be on its device: a 0-dim tensor (a plain float once read) or a :class:`Deferred` (a tensor and
its declared class). :func:`read_metrics` reads every such value of a step's parts with one host transfer per
device, so the hot path (the objective, per minibatch) never waits on the device for a metric; the values read are
the tensors' own (float32 widened exactly to a float, as ``.item()`` would).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch


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


class Deferred:
    """A metric not read from its device yet: a 0-dim ``value`` and the class that declares how it combines
    (``Min(t)`` would read the tensor at once; ``Deferred(t, Min)`` waits for :func:`read_metrics`)."""

    __slots__ = ("value", "kind")

    def __init__(self, value: torch.Tensor, kind: type[Declared]) -> None:
        self.value = value
        self.kind = kind

    def __repr__(self) -> str:
        return f"Deferred({self.value!r}, {self.kind.__name__})"


def read_metrics(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """``parts`` with every tensor and :class:`Deferred` value read as a float (a Deferred's as its declared class):
    the values of each device stacked and copied to the host at once, one transfer per device for all the parts."""
    torch = sys.modules.get("torch")  # not imported: no value can be a tensor (the CLI's plots read metrics without it)
    if torch is None:
        return [dict(part) for part in parts]
    pending: dict[torch.device, list[tuple[int, str]]] = {}
    for index, part in enumerate(parts):
        for key, value in part.items():
            tensor = _tensor(value)
            if isinstance(tensor, torch.Tensor):
                pending.setdefault(tensor.device, []).append((index, key))
    out = [dict(part) for part in parts]
    for places in pending.values():
        values = [_tensor(parts[index][key]) for index, key in places]
        # float64 holds every float32 / bfloat16 value exactly: what .item() of each would have given
        read = torch.stack([v.detach().reshape(()).to(torch.float64) for v in values]).tolist()
        for (index, key), number in zip(places, read, strict=True):
            value = parts[index][key]
            out[index][key] = value.kind(number) if isinstance(value, Deferred) else number
    return out


def _tensor(value: Any) -> torch.Tensor:
    return value.value if isinstance(value, Deferred) else value


def _reduce(values: Sequence[float], over: str) -> float:
    kind = declared(values[0])  # the first producer's declaration
    value = REDUCERS[getattr(kind, over)](values)
    return kind(value) if isinstance(values[0], Declared) else value


def reduce_minibatches(parts: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Combine the metrics of the parts of one step, per key by the value's declared reduction over minibatches
    (``over_minibatches``), keeping its class: the step's minibatch updates, and also its generation batches and
    the ranks' shares of scoring. A plain float is a :class:`Mean` (the mean of its finite values); values still
    on a device (tensors, :class:`Deferred`) are read first, all at once (:func:`read_metrics`)."""
    parts = read_metrics(parts)
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
