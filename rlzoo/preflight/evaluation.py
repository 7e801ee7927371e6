"""Evaluation settings that cannot sample: several greedy samples per prompt."""

from __future__ import annotations

from rlzoo.interfaces import Problem, RunFacts


def evaluation_rule(run: RunFacts) -> list[Problem]:
    """Several responses per prompt need a temperature above 0 (greedy ones would be copies)."""
    t = run.config.train
    if t.eval_samples_per_prompt > 1 and t.eval_temperature == 0:
        return [
            (
                "train.eval_samples_per_prompt",
                f"{t.eval_samples_per_prompt} responses per prompt at eval_temperature 0 (greedy) are copies of one "
                "response, and vLLM refuses them: use 1, or set train.eval_temperature > 0",
            )
        ]
    return []
