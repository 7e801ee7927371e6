"""The run's failure policy: which faults inside a step the run rides out, and when it stops.

Faults are contained where they happen and counted in the step's metrics (docs/faults.md), as values declared
fault counts (:mod:`rlzoo.util.reductions`); the policy reads those declarations, whatever the keys:

- a verifier that raises, hangs past ``train.verifier_timeout_s`` or returns a non-finite reward: that response
  scores 0 (:mod:`rlzoo.rl.scoring`; ``verifier/errors``, ``verifier/timeouts``, ``verifier/nonfinite_rewards``,
  declared :class:`~rlzoo.util.reductions.UnscoredResponses`);
- a loss or gradient norm that is not finite: the training engine skips that update (``train/nonfinite_steps``,
  declared :class:`~rlzoo.util.reductions.SkippedUpdates`);
- an environment that raises in ``reset`` or ``step``: that episode ends there with reward 0
  (:mod:`rlzoo.episodes.runner`; ``env/<name>/errors``, declared :class:`~rlzoo.util.reductions.FailedEpisodes`).

A step *fails* when any of its updates was skipped, or when not one response of its batch could be scored, or
when every one of its episodes failed in its environment (the update then learns from nothing but zeros). The
driver asks :meth:`FaultPolicy.check` once per step, after logging its metrics and before writing its checkpoint:
``train.max_consecutive_failures`` failed steps in a row stop the run with :class:`StepFailure`, so the newest
checkpoint is the one written before the streak went bad. With several processes every rank sees the same
(rank-averaged) metrics and stops at the same step. The streak is not checkpointed: a resumed run starts with none.

A component whose method raises in the middle of a run (a loss, an advantage, a script's clipper; not a verifier or
an environment, whose faults are contained as above) ends it: :func:`component_failure` turns the exception into
one line naming the component as the registry does, its file and line, the exception and the step, the traceback
logged into the run's ``log.txt``; the run stops before that step's checkpoint, so the last one is intact.

Nothing non-finite is saved: before each checkpoint the driver asks :meth:`FaultPolicy.check_weights`, which asks
every engine the checkpoint would hold (the policy's, a critic's) whether its weights are all finite
(:meth:`rlzoo.engines.TrainingEngine.weights_finite`, combined over the ranks); if not, the run stops at once with
:class:`NonFiniteWeights`, that checkpoint unwritten and the previous one (and ``latest``) as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlzoo.component_errors import component_raised, raising_component
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Component
from rlzoo.registry import ComponentInfo, Registry
from rlzoo.runtime.checkpoint.files import latest_checkpoint
from rlzoo.util.reductions import Declared, FailedEpisodes, SkippedUpdates, UnscoredResponses

log = logging.getLogger("rlzoo.runtime.faults")


class StepFailure(RlzooError):
    """Too many failed steps in a row: the run stopped, its last checkpoint intact."""


class NonFiniteWeights(StepFailure):
    """The weights became non-finite: the run stopped before writing them into a checkpoint."""


class ComponentFailure(RlzooError):
    """A component raised in the middle of a run: the run stopped, its last checkpoint intact."""


def component_failure(exc: Exception, registry: Registry, run_dir: Path, step: int | None) -> ComponentFailure | None:
    """``exc`` as one line naming the component in whose method it was raised (:func:`rlzoo.component_errors.raising_component`),
    with its traceback logged (the run's log file); ``None`` when no component raised it, or it is a user-facing
    error already (an :class:`RlzooError` says what is wrong itself)."""
    if isinstance(exc, RlzooError):
        return None
    # only a registered component's (a base class's default instance, say, is rlzoo's own)
    component = raising_component(exc, lambda c: _registration(registry, c) is not None)
    if component is None:
        return None
    log.info("the traceback of that failure:", exc_info=exc)
    distribution = _registration(registry, component).distribution
    when = f"at step {step}" if step is not None else "while the run was set up"
    failure = ComponentFailure(
        f"stopped {when}: {component_raised(component, exc, distribution)}; its traceback is in the run's log.txt; "
        f"{checkpoint_kept(run_dir)}"
    )
    failure.__cause__ = exc  # as `raise failure from exc`: --verbose shows the component's traceback first
    return failure


@contextmanager
def naming_components(registry: Registry, run_dir: Path) -> Iterator[None]:
    """A registered component's exception in the block as one line naming it (:func:`component_failure`), for
    commands that run components outside :meth:`TrainingRun.run` (``rlzoo sft``)."""
    try:
        yield
    except Exception as exc:
        raise component_failure(exc, registry, run_dir, None) or exc  # noqa: B904 - its own cause


def _registration(registry: Registry, component: Component) -> ComponentInfo | None:
    """How ``registry`` registers ``component`` (its name, and a class it is an instance of); ``None``: it does not."""
    found = [
        i for i in registry.components(component.kind) if i.name == component.name and isinstance(component, i.cls)
    ]
    return found[0] if found else None


class FaultPolicy:
    """Counts failed steps in a row and stops the run after ``max_consecutive`` of them."""

    def __init__(self, max_consecutive: int, responses_per_step: int, run_dir: Path) -> None:
        self.max_consecutive = max_consecutive
        self.responses_per_step = responses_per_step
        self.run_dir = Path(run_dir)
        self.streak = 0

    def failure(self, metrics: dict[str, float]) -> str | None:
        """Why the step that logged ``metrics`` failed, or ``None`` if it did not: the values declared
        :class:`SkippedUpdates` sum to more than 0, or those declared :class:`UnscoredResponses` (or
        :class:`FailedEpisodes`: an episode is one response) to the step's responses. Plain numbers are never
        faults, whatever their keys."""
        skipped = declared_as(metrics, SkippedUpdates)
        if sum(skipped.values()) > 0:
            detail = ", ".join(skipped)
            return f"the loss or gradient norm was not finite ({sum(skipped.values()):g} update(s) skipped, {detail})"
        unscored = declared_as(metrics, UnscoredResponses)
        if unscored and sum(unscored.values()) >= self.responses_per_step:
            detail = ", ".join(f"{key} {value:g}" for key, value in unscored.items())
            return f"none of the {self.responses_per_step} responses could be scored ({detail})"
        failed = declared_as(metrics, FailedEpisodes)
        if failed and sum(failed.values()) >= self.responses_per_step:
            detail = ", ".join(f"{key} {value:g}" for key, value in failed.items())
            return f"every one of the {self.responses_per_step} episodes failed in its environment ({detail})"
        return None

    def check(self, step: int, metrics: dict[str, float]) -> None:
        """Record step ``step``; raise :class:`StepFailure` when it makes ``max_consecutive`` failures in a row."""
        cause = self.failure(metrics)
        if cause is None:
            self.streak = 0
            return
        self.streak += 1
        if self.streak < self.max_consecutive:
            log.warning(
                "step %d failed (%d in a row of at most %d): %s", step, self.streak, self.max_consecutive, cause
            )
            return
        raise StepFailure(
            f"stopped at step {step} after {self.streak} failed steps in a row (train.max_consecutive_failures: "
            f"{self.max_consecutive}): {cause}; {checkpoint_kept(self.run_dir)}"
        )

    def check_weights(self, step: int, engines: Mapping[str, Any]) -> None:
        """Before step ``step``'s checkpoint: raise :class:`NonFiniteWeights` when any of ``engines`` (by what they
        train: ``policy``, ``critic``) holds a NaN or infinite weight. A collective (every rank asks every engine,
        in the same order)."""
        bad = [name for name, engine in engines.items() if not engine.weights_finite()]
        if bad:
            whose = " and ".join(f"{name}'s" for name in bad)
            raise NonFiniteWeights(
                f"stopped at step {step}: the {whose} weights are not finite (NaN or infinite) after this step's "
                f"updates, so its checkpoint was not written (a learning rate too high, e.g. trainer.lr, can do "
                f"this); {checkpoint_kept(self.run_dir)}"
            )


def checkpoint_kept(run_dir: Path) -> str:
    """What a stopped run leaves to continue from: its last checkpoint, intact, and how to resume it."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return "no checkpoint had been written yet"
    return (
        f"the last checkpoint, {checkpoint}, is intact: fix the cause, then continue with "
        f"`rlzoo train CONFIG --resume {run_dir}`"
    )


def declared_as(metrics: dict[str, float], fault: type[Declared]) -> dict[str, float]:
    """The values of ``metrics`` declared as ``fault`` (a class of :mod:`rlzoo.util.reductions`), by key."""
    return {key: value for key, value in metrics.items() if isinstance(value, fault)}
