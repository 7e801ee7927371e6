"""The base every pluggable component shares: a kind, a name, and a pydantic parameter model.

A component is a small class. The registry finds it through a plugin hook, the config selects it with
``name:`` and validates the remaining keys against its ``Params`` model (unknown keys are errors).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from rlzoo.util.strict_numbers import StrictNumbers

if TYPE_CHECKING:
    from rlzoo.interfaces.run_facts import Problem, RunFacts


class Params(StrictNumbers, BaseModel):
    """Parameters of a component. Extra keys are rejected so a typo is an error, not a silent default; numbers must
    be finite (``inf`` / ``nan`` are refused, as in every config section: use ``None`` for "no limit"), an integer
    is an integer (not a boolean) and a float fits in float32 (:mod:`rlzoo.util.strict_numbers`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: the module's Params model under another name: inside Component, ``Params`` is the class attribute
_ParamsModel = Params


class Component:
    """A named, configurable building block.

    Subclasses set ``name`` (unique within their ``kind``) and, if they take parameters, a nested ``Params``
    model. The first line of the class docstring is the summary shown by ``rlzoo plugins list``; the rest
    states the formula.

    The catalogue attributes feed the generated component table (docs/components.md); all are optional:
    ``formula`` (one line, plain text), ``reference`` (the paper or source), ``verl_name`` and ``trl_name``
    (what verl / TRL call the same thing, empty where they have none).
    """

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params
    formula: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    verl_name: ClassVar[str] = ""
    trl_name: ClassVar[str] = ""
    #: Python packages the component imports when it starts (a run checks they are installed before starting)
    requires: ClassVar[tuple[str, ...]] = ()
    #: how to install ``requires``, shown when one is missing
    install_hint: ClassVar[str] = ""
    #: the first part of the keys of this kind's :meth:`report` metrics; each kind's base class sets it once
    #: (empty: the ``kind``)
    metric_namespace: ClassVar[str] = ""

    def __init__(self, params: _ParamsModel | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """The problems a run with these parameters would hit, found before anything starts.

        ``rlzoo config check`` and the start of ``rlzoo train`` (:func:`rlzoo.preflight.checks.preflight`) construct every
        component the config names and call this on each; ``at`` is this component's config field (e.g.
        ``rollout.engine``, ``algorithm.reward_shaping.0``) and ``run`` what is known without starting anything:
        the config, the model's facts, the process count, the other components and the memory estimate
        (:class:`rlzoo.interfaces.RunFacts`). Return ``(dotted field, message)`` pairs — usually
        ``f"{at}.<parameter>"``, or another field the rule is about — each message saying what is allowed. Must
        be cheap: read files' metadata at most, never load data, weights or an engine's library. ``[]`` (the
        default): nothing to report.
        """
        return []

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0].strip() if doc else ""

    def report(self, metric: str, value: float) -> None:
        """Report a scalar metric of the call in progress; it appears in the step's metrics as
        ``<metric_namespace>/<name>/<metric>`` (e.g. ``shaping/overlong/penalised_fraction``).

        ``value`` is a plain float (averaged) or one of the declared reductions of :mod:`rlzoo.metrics` (``Mean``,
        ``Sum``, ``Min``, ``Max``, or the fault declarations ``SkippedUpdates``, ``UnscoredResponses``): that
        class says how the values of the step's several calls (its minibatches, its generation batches) and of
        the ranks combine. Reporting the same ``metric`` twice in one call keeps the last value.

        The step collects the reports: each of its phases runs in a scope (:func:`collecting`), and a report goes
        to the innermost scope open in this thread; no caller drains a component. A scope's bounds are where values
        combine: the objective's call on each minibatch (ratio estimator, clipper, aggregation, KL estimator,
        regularisers) and the critic's value loss, each update of a training engine (the minibatch's metrics), each
        generation batch (the rollout engine, per rank; the reward shapers; the batch filter), the old pass (the
        train-inference correction, also when it picks the loss's tokens), the advantage phase (the source, the
        KL-in-reward controller), the learner's other passes and weight syncs (the training and rollout engines)
        and the router policy's choices (:mod:`rlzoo.rl.routing_learner`). Verifiers' reports are not collected: a
        verifier runs in a worker thread that may outlive its time limit, so its reports would be racy or lost;
        its faults are counted by :mod:`rlzoo.rl.scoring`, and it records its phases' metrics with
        :meth:`rlzoo.interfaces.Verifier.record_phase` instead. Called outside any scope (a test, a loop of one's
        own), the component keeps its reports until :func:`take_reports` takes them.
        """
        key = _report_key(self, metric)
        scope = _scope.get()
        if scope is not None:
            scope[key] = value
            return
        self.__dict__.setdefault("_metric_reports", {})[key] = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"


#: the innermost open scope of this thread (and context): where Component.report writes
_scope: ContextVar[dict[str, Any] | None] = ContextVar("rlzoo_report_scope", default=None)


@contextmanager
def collecting(into: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """A scope of reports: every :meth:`Component.report` made during the block in this thread, keyed
    ``<namespace>/<name>/<metric>``, lands in ``into`` (a new dict when ``None``), which the block receives.

    Scopes nest: a report goes to the innermost one only, and the code that opened it passes its reports on (as a
    minibatch's metrics, a generation batch's, a rank's share): a scope's bounds are where the reported values
    combine with those of the other calls (each value's reduction, :mod:`rlzoo.metrics`). A report made twice in
    one scope keeps the last value. A thread starts outside any scope, so a component called in a thread of its
    own (a verifier's worker) reports to no step. For a test or a loop of one's own::

        with collecting() as reports:
            correction.weights(old_train, old_rollout, mask)
        reports["correction/tis/oob_fraction"]
    """
    reports: dict[str, Any] = {} if into is None else into
    token = _scope.set(reports)
    try:
        yield reports
    finally:
        _scope.reset(token)


def take_reports(component: Component) -> dict[str, float]:
    """What ``component`` reported outside any scope (:func:`collecting`) since the last call, keyed
    ``<namespace>/<name>/<metric>``, and its buffer cleared: for a component called by a test or a loop of one's
    own; rlzoo's step never needs it (its phases are scopes).

    ``<namespace>`` is the kind's ``metric_namespace`` (its ``kind`` if it declares none), ``<name>`` the
    component's registered name: the name keeps two components of one kind in a run (two reward shapers, two
    regularisers) from writing the same key, and says which component a key came from."""
    reports = component.__dict__.pop("_metric_reports", None)
    return dict(reports) if reports else {}


def _report_key(component: Component, metric: str) -> str:
    return f"{component.metric_namespace or component.kind}/{component.name}/{metric}"
