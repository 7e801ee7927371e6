"""Scoring responses with a verifier, robustly, and placing process-reward steps on response tokens.

A verifier's faults cost the affected responses their reward, never the run: a response whose verifier raised,
was not scored within the batch's time limit, or got a non-finite reward (or step reward, or reward part) scores 0
(each of its reward parts too) and is counted
(:meth:`Scores.metrics`). Whether too many of them stop the run is :mod:`rlzoo.runtime.faults`' call. What the verifier
measured of its own phases (:meth:`rlzoo.interfaces.Verifier.take_phase_metrics`: ``time/reward_model``, ...) is
taken after each scoring and joins the same metrics.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from dataclasses import dataclass, field, replace

from rlzoo.interfaces import Sample, Verdict, Verifier
from rlzoo.util.reductions import UnscoredResponses

log = logging.getLogger("rlzoo.rl.scoring")


@dataclass
class Scores:
    verdicts: list[Verdict]
    errors: int  # the verifier raised
    timeouts: int = 0  # not scored within the time limit
    nonfinite: int = 0  # a NaN or infinite reward or step reward
    phase: dict[str, float] = field(default_factory=dict)  # the verifier's phase metrics (take_phase_metrics)

    @property
    def failed(self) -> int:
        """Responses that scored 0 because of a verifier fault."""
        return self.errors + self.timeouts + self.nonfinite

    def metrics(self) -> dict[str, float]:
        """The fault counts, declared :class:`~rlzoo.util.reductions.UnscoredResponses` (what the fault policy reads), and
        the verifier's phase metrics as it declared them (e.g. ``time/reward_model``, a ``Sum``; never in place of a
        fault count)."""
        return {
            **self.phase,
            "verifier/errors": UnscoredResponses(self.errors),
            "verifier/timeouts": UnscoredResponses(self.timeouts),
            "verifier/nonfinite_rewards": UnscoredResponses(self.nonfinite),
        }


def score(verifier: Verifier, samples: list[Sample], responses: list[str], timeout_s: float | None = None) -> Scores:
    """Score ``responses``; faults give reward 0 and are counted, never raised.

    ``verify_batch`` is tried first; if it raises, each response is verified on its own to isolate the failing
    ones. With ``timeout_s`` the verification runs in a worker thread and the caller waits at most that long for
    the whole batch: every response without a verdict by then (all of them, if ``verify_batch`` was still
    running) gets 0 and counts as a timeout. Python cannot stop a thread, so a verifier that hangs keeps its
    thread (a daemon: it does not keep the process alive); give verifiers their own per-response limits too.
    """
    slots: list[Verdict | None] = [None] * len(responses)
    raised: set[int] = set()  # indices whose verifier raised (their slot is written right after)

    def verify_all() -> None:
        try:
            verdicts = verifier.verify_batch(samples, responses)
            if len(verdicts) != len(responses):
                raise ValueError(f"verify_batch returned {len(verdicts)} verdicts for {len(responses)} responses")
            unscored = [v for v in verdicts if isinstance(v, Exception)]
            if unscored:  # one line per scoring: a service that is down fails every response alike
                log.warning(
                    "verifier %s could not score %d of %d responses (the first: %s)",
                    verifier.name,
                    len(unscored),
                    len(verdicts),
                    unscored[0],
                )
            for index, verdict in enumerate(verdicts):
                if isinstance(verdict, Exception):  # that response could not be scored (Verifier.verify_batch)
                    raised.add(index)
                    verdict = Verdict(0.0, reason=f"verifier error: {type(verdict).__name__}: {verdict}")
                slots[index] = verdict
            return
        except Exception:
            pass  # fall back to one call per response to isolate the failing ones
        for index, (sample, response) in enumerate(zip(samples, responses, strict=True)):
            try:
                slots[index] = verifier.verify(sample, response)
            except Exception as exc:
                raised.add(index)
                log.warning("verifier %s raised %s: %s", verifier.name, type(exc).__name__, exc)
                slots[index] = Verdict(0.0, reason=f"verifier error: {type(exc).__name__}: {exc}")

    if timeout_s is None:
        verify_all()
    else:
        worker = threading.Thread(target=verify_all, name=f"verifier-{verifier.name}", daemon=True)
        worker.start()
        worker.join(timeout_s)
    done = list(slots)  # a copy: a hung worker may still write into ``slots``
    errors = sum(1 for index in list(raised) if done[index] is not None)  # each response counted once
    verdicts: list[Verdict] = []
    timeouts = 0
    for verdict in done:
        if verdict is None:
            timeouts += 1
            verdict = Verdict(0.0, reason=f"verifier timeout: not scored within {timeout_s:g} s")
        verdicts.append(verdict)
    if timeouts:
        log.warning(
            "verifier %s did not score %d of %d responses within %g s",
            verifier.name,
            timeouts,
            len(verdicts),
            timeout_s,
        )
    nonfinite = 0
    for index, verdict in enumerate(verdicts):
        if not _finite(verdict):
            nonfinite += 1
            verdicts[index] = replace(
                verdict,
                reward=0.0,
                step_rewards=[0.0] * len(verdict.step_rewards) if verdict.step_rewards is not None else None,
                parts=None,  # every part of the batch is then 0 for this response (rollouts.verdict_parts)
                reason=f"non-finite reward {verdict.reward!r} from verifier {verifier.name}",
            )
    if nonfinite:
        log.warning(
            "verifier %s gave %d of %d responses a non-finite reward; they score 0",
            verifier.name,
            nonfinite,
            len(verdicts),
        )
    return Scores(verdicts, errors, timeouts, nonfinite, _phase_metrics(verifier))


def _phase_metrics(verifier: Verifier) -> dict[str, float]:
    """The verifier's phase metrics since the last scoring; a verifier whose method fails loses them, never the run."""
    try:
        return dict(verifier.take_phase_metrics())
    except Exception as exc:
        log.warning("verifier %s: take_phase_metrics raised %s: %s", verifier.name, type(exc).__name__, exc)
        return {}


def _finite(verdict: Verdict) -> bool:
    """The reward, step rewards and reward parts are finite numbers (parts: a dict of named numbers)."""
    if verdict.parts is not None and not (
        isinstance(verdict.parts, dict) and all(isinstance(name, str) for name in verdict.parts)
    ):
        return False
    parts = list(verdict.parts.values()) if verdict.parts is not None else []
    try:
        return all(math.isfinite(float(v)) for v in [verdict.reward, *(verdict.step_rewards or []), *parts])
    except (TypeError, ValueError):  # not a number at all
        return False


def step_token_ends(spans: list[tuple[int, int]], token_char_ends: list[int]) -> list[int]:
    """Exclusive response-token index at which each character span ends."""
    return [min(bisect.bisect_left(token_char_ends, end) + 1, len(token_char_ends)) for _, end in spans]
