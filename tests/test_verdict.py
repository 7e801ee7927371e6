"""Whether a response counts as correct is the verifier's verdict: the loop's accuracy metrics read it."""

from __future__ import annotations

import torch

from rlzoo.engines import Generation
from rlzoo.interfaces import Sample, Verdict
from rlzoo.rl.rollouts import ScoredGroup, rollout_metrics


def test_correct_defaults_to_the_binary_convention_and_can_be_declared():
    assert Verdict(1.0).correct and not Verdict(0.99).correct
    assert Verdict(0.3, correct=True).correct and not Verdict(2.0, correct=False).correct


def test_correct_fraction_counts_the_verdicts_not_the_rewards():
    verdicts = [Verdict(0.4, correct=True), Verdict(0.9, correct=True), Verdict(1.5, correct=False), Verdict(0.0)]
    generations = [Generation([1], [2], [-0.1], True) for _ in verdicts]
    group = ScoredGroup(
        Sample(prompt="q", answer="a"),
        generations,
        verdicts,
        torch.tensor([v.reward for v in verdicts]),
        torch.zeros(4),
    )
    assert rollout_metrics([group], {})["reward/correct_fraction"] == 0.5
