"""Scoring responses with a verifier, robustly, and placing process-reward steps on response tokens."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

from rlzoo.interfaces import Sample, Verdict, Verifier

log = logging.getLogger("rlzoo.scoring")


@dataclass
class Scores:
    verdicts: list[Verdict]
    errors: int


def score(verifier: Verifier, samples: list[Sample], responses: list[str]) -> Scores:
    """A verifier that raises gives reward 0 to the affected responses and is counted, never fatal."""
    try:
        return Scores(verifier.verify_batch(samples, responses), 0)
    except Exception:
        pass  # fall back to one call per response to isolate the failing ones
    verdicts, errors = [], 0
    for sample, response in zip(samples, responses, strict=True):
        try:
            verdicts.append(verifier.verify(sample, response))
        except Exception as exc:
            errors += 1
            log.warning("verifier %s raised %s: %s", verifier.name, type(exc).__name__, exc)
            verdicts.append(Verdict(0.0, reason=f"verifier error: {type(exc).__name__}: {exc}"))
    return Scores(verdicts, errors)


def step_token_ends(spans: list[tuple[int, int]], token_char_ends: list[int]) -> list[int]:
    """Exclusive response-token index at which each character span ends."""
    return [min(bisect.bisect_left(token_char_ends, end) + 1, len(token_char_ends)) for _, end in spans]
