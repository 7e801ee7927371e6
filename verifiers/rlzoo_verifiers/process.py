"""The ``process`` verifier: one reward per step of a ``;``-separated multi-step response (the ``chain`` task)."""

from __future__ import annotations

from pydantic import Field

import rlzoo
from rlzoo.errors import DataError
from rlzoo.interfaces import Params, Sample, Verdict, Verifier


@rlzoo.register("verifier", "process")
class ProcessVerifier(Verifier):
    """Per-step rewards: the response's k-th ``;``-separated step is checked against ``meta["steps"][k]``.

    The response is split on ``separator``; step k gets reward 1.0 if its text (surrounding whitespace ignored)
    equals ``meta["steps"][k]``, else 0.0. Extra steps get 0; missing steps simply have no reward, so
    ``step_rewards`` has one entry per step the response wrote. ``step_spans`` are the ``(start, end)``
    character spans of each step's text in the response (whitespace excluded). The outcome reward is 1.0 iff
    the response has exactly as many steps as expected and its last step equals the answer. An empty response
    has no steps. Samples need ``meta["steps"]`` (a list; numbers are compared by their text).
    """

    class Params(Params):
        separator: str = Field(";", min_length=1, description="what separates the steps of a response")

    def verify(self, sample: Sample, response: str) -> Verdict:
        expected = sample.meta.get("steps")
        if not isinstance(expected, (list, tuple)):
            raise DataError(
                f"the process verifier needs meta['steps'] (a list of expected step values); "
                f"sample {sample.prompt[:60]!r} has {type(expected).__name__}"
            )
        expected = [str(s).strip() for s in expected]
        steps: list[str] = []
        spans: list[tuple[int, int]] = []
        if response.strip():
            start = 0
            for piece in response.split(self.params.separator):
                lead = len(piece) - len(piece.lstrip())
                text = piece.strip()
                spans.append((start + lead, start + lead + len(text)))
                steps.append(text)
                start += len(piece) + len(self.params.separator)
        step_rewards = [1.0 if k < len(expected) and step == expected[k] else 0.0 for k, step in enumerate(steps)]
        correct = len(steps) == len(expected) and bool(steps) and steps[-1] == sample.answer.strip()
        if correct:
            reason = None
        elif len(steps) != len(expected):
            reason = f"{len(steps)} steps, expected {len(expected)}"
        else:
            reason = "wrong final value"
        return Verdict(reward=1.0 if correct else 0.0, step_rewards=step_rewards, step_spans=spans, reason=reason)
