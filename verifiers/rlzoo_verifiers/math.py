"""The ``math`` verifier: mathematical equivalence with the reference answer, via the ``math-verify`` library."""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

from pydantic import Field

from rlzoo.interfaces import Params, Sample, Verdict, Verifier

_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")


def _looks_bare(text: str) -> bool:
    """A bare expression (``46``, ``2^{10}``, ``\\frac{1}{2}``) rather than prose or delimited LaTeX."""
    return len(text) <= 200 and not _DELIMITED.search(text) and not _WORD.search(_LATEX_COMMAND.sub("", text))


@functools.cache
def _math_verify() -> Any:
    import math_verify  # sympy-heavy (~0.5 s): imported on first use, not at plugin discovery

    return math_verify


def _is_number(item: Any) -> bool:
    return isinstance(item, str) or bool(getattr(item, "is_Number", False))


class MathVerifier(Verifier):
    """Reward 1 if the response is mathematically equal to the answer (math-verify: numbers, fractions, LaTeX).

    Both the reference answer and the response are parsed with ``math_verify.parse`` and compared with
    ``math_verify.verify`` (numeric comparison to ``float_rounding`` places, symbolic equality, sets,
    intervals, ...). A bare expression such as ``46``, ``2^{10}`` or ``\\frac{1}{2}`` is parsed as LaTeX
    (wrapped in ``$...$``), since math-verify's plain-text extraction reads ``2^{10}`` as ``2``; prose and
    delimited LaTeX (``$...$``, ``\\boxed{}``) are parsed as they are, so ``The answer is 46`` also counts.

    ``numbers_only`` (default true): when the reference answer is a number, only numbers found in the response
    count, so an unevaluated expression such as ``12+34`` does not score for ``46`` (otherwise a policy can
    collect the reward by echoing an arithmetic prompt). A reference answer math-verify cannot parse is
    compared as stripped text. ``timeout_s`` bounds math-verify's parsing and comparison with its SIGALRM
    timer; that timer only works in the main thread, so elsewhere the check runs without a timeout. Note that
    math-verify's timer cancels any ``signal.alarm`` the caller had pending.
    """

    name = "math"

    class Params(Params):
        numbers_only: bool = Field(True, description="a numeric answer accepts only numbers, not expressions")
        float_rounding: int = Field(6, ge=0, description="decimal places floats are rounded to before comparing")
        timeout_s: int = Field(5, ge=0, description="math-verify's per-operation timeout (main thread); 0: none")

    def _timeout(self) -> int | None:
        usable = self.params.timeout_s > 0 and threading.current_thread() is threading.main_thread()
        return self.params.timeout_s if usable else None

    def _parse(self, text: str) -> list[Any]:
        mv, text, timeout = _math_verify(), text.strip(), self._timeout()
        if not text:
            return []
        if _looks_bare(text):
            parsed = mv.parse(f"${text}$", parsing_timeout=timeout)
            if parsed:
                return parsed
        return mv.parse(text, parsing_timeout=timeout)

    @functools.lru_cache(maxsize=8192)  # noqa: B019 - one verifier per run; answers repeat across a group
    def _parse_answer(self, answer: str) -> tuple[Any, ...]:
        return tuple(self._parse(answer))

    def verify(self, sample: Sample, response: str) -> Verdict:
        gold = list(self._parse_answer(sample.answer))
        if not gold:
            reward = 1.0 if response.strip() == sample.answer.strip() else 0.0
            return Verdict(reward=reward, reason="answer not parseable; compared as text")
        pred = self._parse(response)
        if self.params.numbers_only and bool(getattr(gold[0], "is_Number", False)):
            pred = [p for p in pred if _is_number(p)]
        if not pred:
            return Verdict(reward=0.0, reason="no answer found in response")
        ok = _math_verify().verify(
            gold, pred, float_rounding=self.params.float_rounding, timeout_seconds=self._timeout()
        )
        return Verdict(reward=1.0 if ok else 0.0)
