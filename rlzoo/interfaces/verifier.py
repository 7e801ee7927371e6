"""Verifiers: score a response to a sample."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlzoo.interfaces.base import Component
from rlzoo.interfaces.task import Sample
from rlzoo.util.reductions import REDUCERS, Sum, declared

_PHASE_LOCK = threading.Lock()  # guards every verifier's phase metrics (scoring may run in a worker thread)


@dataclass
class Verdict:
    """A verifier's score of one response.

    reward:       the outcome reward (1.0 correct, 0.0 wrong for binary verifiers).
    step_rewards: per-step rewards (process verifiers), or ``None``.
    step_spans:   ``(start, end)`` character spans in the response, one per step reward.
    reason:       why a response got its reward when that is not obvious (timeout, memory limit, ...).
    correct:      whether the response counts as correct (``reward/correct_fraction``, ``eval/accuracy``,
                  pass@k). Left out, it is ``reward >= 1.0``, the binary verifiers' convention; a verifier whose
                  rewards mean something else (a reward model's score, partial credit) says it itself.
    parts:        named parts of the reward (e.g. ``{"correct": 1.0, "format": 0.5}``), for advantages that treat
                  each on its own (``gdpo``) and the ``reward/parts/<name>_mean`` metrics; ``None``: none. ``reward``
                  stays the one number the other advantages read (how the parts make it is the verifier's business).
    """

    reward: float
    step_rewards: list[float] | None = None
    step_spans: list[tuple[int, int]] | None = None
    reason: str | None = None
    correct: bool | None = None
    parts: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.correct is None:
            self.correct = self.reward >= 1.0


class Verifier(Component):
    """``verify(sample, response) -> Verdict``.

    A verifier may raise on a pathological response; the loop then gives that response reward 0 and counts
    the error in ``verifier/errors`` instead of stopping the run. ``verify_batch`` may be overridden to score
    many responses at once (for example in parallel subprocesses).

    Phase metrics. A verifier cannot :meth:`~rlzoo.interfaces.Component.report` (it may run in a worker thread
    that outlives its time limit), but it may time and measure its own phases (a reward model's forward passes)
    with :meth:`timed_phase` and :meth:`record_phase`: the values accumulate, thread-safely, until
    :func:`rlzoo.rl.scoring.score` takes them (:meth:`take_phase_metrics`) after each scoring and adds them to the
    step's metrics under their own keys (``time/reward_model``, ``memory/reward_model_peak_gb``). A scoring that
    outlived ``train.verifier_timeout_s`` adds what it measured to a later scoring's metrics.
    """

    kind = "verifier"

    def verify(self, sample: Sample, response: str) -> Verdict:
        raise NotImplementedError

    def verify_batch(self, samples: list[Sample], responses: list[str]) -> list[Verdict | Exception]:
        """One verdict per response, in order. An exception *in place of* a verdict says that response could not be
        scored (a service that failed for it): :func:`rlzoo.rl.scoring.score` counts it in ``verifier/errors`` and
        gives it 0, as if ``verify`` had raised, without scoring the others again."""
        return [self.verify(s, r) for s, r in zip(samples, responses, strict=True)]

    def use_run_folder(self, run_dir: Path) -> None:
        """Called by ``rlzoo train`` with the run's folder (the same folder on a resume) before the first scoring,
        for state a verifier keeps across a resume (a service verifier's reply cache). Default: nothing."""

    def reward_parts(self) -> tuple[str, ...] | None:
        """The names of the parts every verdict of this verifier carries (:attr:`Verdict.parts`), so that a run
        whose advantage reads parts (``gdpo``) is checked before it starts; ``()``: it returns none. ``None`` (the
        default): not declared, a verdict may carry parts or not, and a missing part is reported when the step that
        needs it is scored."""
        return None

    def judges_correctness(self) -> bool:
        """Whether :attr:`Verdict.correct` is this verifier's judgement. ``False`` for one that only scores (a
        reward model without a threshold: its verdicts are never correct); a combination of verifiers (``weighted``)
        decides correctness by the parts that judge it."""
        return True

    def record_phase(self, key: str, value: float) -> None:
        """Add ``value`` to the phase metric ``key`` (a full metric key, e.g. ``memory/reward_model_peak_gb``),
        combined with the value held since the last :meth:`take_phase_metrics` by its declared reduction over
        minibatches: a :class:`~rlzoo.util.reductions.Sum` adds up, ``Min`` / ``Max`` keep the extreme, a plain float (or
        ``Mean``) keeps the latest value. Thread-safe."""
        with _PHASE_LOCK:
            held = self.__dict__.setdefault("_phase_metrics", {})
            kind = declared(value)
            if key in held and kind.over_minibatches in ("sum", "min", "max"):
                value = kind(REDUCERS[kind.over_minibatches]([held[key], value]))
            held[key] = value

    @contextmanager
    def timed_phase(self, name: str) -> Iterator[None]:
        """Time the block into ``time/<name>``: a :class:`~rlzoo.util.reductions.Sum` of seconds (summed over the step's
        scorings: its generation batches, and the ranks' shares when every rank scores its own)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record_phase(f"time/{name}", Sum(time.perf_counter() - start))

    def take_phase_metrics(self) -> dict[str, float]:
        """The phase metrics recorded since the last call, and the buffer cleared (``{}`` when none were).
        :func:`rlzoo.rl.scoring.score` calls it after every scoring; a verifier made of others (``weighted``) overrides
        it to add its parts' (:meth:`record_phase` each of theirs, then return ``super().take_phase_metrics()``)."""
        with _PHASE_LOCK:
            return self.__dict__.pop("_phase_metrics", None) or {}
