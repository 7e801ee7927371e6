"""Verifiers: score a response to a sample."""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo.interfaces.base import Component
from rlzoo.interfaces.task import Sample


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
    """

    reward: float
    step_rewards: list[float] | None = None
    step_spans: list[tuple[int, int]] | None = None
    reason: str | None = None
    correct: bool | None = None

    def __post_init__(self) -> None:
        if self.correct is None:
            self.correct = self.reward >= 1.0


class Verifier(Component):
    """``verify(sample, response) -> Verdict``.

    A verifier may raise on a pathological response; the loop then gives that response reward 0 and counts
    the error in ``verifier/errors`` instead of stopping the run. ``verify_batch`` may be overridden to score
    many responses at once (for example in parallel subprocesses).
    """

    kind = "verifier"

    def verify(self, sample: Sample, response: str) -> Verdict:
        raise NotImplementedError

    def verify_batch(self, samples: list[Sample], responses: list[str]) -> list[Verdict]:
        return [self.verify(s, r) for s, r in zip(samples, responses, strict=True)]
