"""The ``math`` verifier: mathematical equivalence with the reference answer, via the ``math-verify`` library."""

from __future__ import annotations

import functools
import multiprocessing
import re
import threading
import weakref
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Params, Sample, Verdict, Verifier

_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")
# a plain integer literal, ASCII digits only (``\\d`` would admit other scripts' digits, which math-verify reads
# differently); 30 digits keeps ``int()`` and math-verify's exact integers far from any limit
_INTEGER = re.compile(r"[+-]?[0-9]{1,30}")


def _looks_bare(text: str) -> bool:
    """A bare expression (``46``, ``2^{10}``, ``\\frac{1}{2}``) rather than prose or delimited LaTeX."""
    return len(text) <= 200 and not _DELIMITED.search(text) and not _WORD.search(_LATEX_COMMAND.sub("", text))


@functools.cache
def _math_verify() -> Any:
    import math_verify  # sympy-heavy (~0.5 s): imported on first use, not at plugin discovery

    return math_verify


def _is_number(item: Any) -> bool:
    return isinstance(item, str) or bool(getattr(item, "is_Number", False))


@rlzoo.register("verifier", "math")
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

    Speed: a response that is the answer itself, or a plain integer against an integer answer, is decided
    without math-verify (same verdict, see :meth:`_fast_verdict`). ``verify_batch`` sends the rest to
    ``workers`` processes (started on the first batch with at least ``parallel_min`` of them, then reused), where
    the SIGALRM timeout applies again: each worker runs them in its main thread.
    """

    requires = ("math_verify",)
    install_hint = "pip install math-verify (a dependency of rlzoo-verifiers: bash scripts/install.sh installs it)"

    class Params(Params):
        numbers_only: bool = Field(True, description="a numeric answer accepts only numbers, not expressions")
        float_rounding: int = Field(6, ge=0, description="decimal places floats are rounded to before comparing")
        timeout_s: int = Field(5, ge=0, description="math-verify's per-operation timeout (main thread); 0: none")
        workers: int = Field(
            2, ge=1, description="processes verify_batch shares math-verify's work between, this one included"
        )
        parallel_min: int = Field(
            64, ge=1, description="responses needing math-verify in one batch before worker processes are used"
        )

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        self._executor: ProcessPoolExecutor | None = None

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
        fast = self._fast_verdict(sample.answer, response)
        return fast if fast is not None else self._verify_slow(sample.answer, response)

    def verify_batch(self, samples: list[Sample], responses: list[str]) -> list[Verdict]:
        """:meth:`verify` for each pair; the responses the fast path cannot decide go to math-verify, shared
        between this process and ``workers - 1`` others when there are at least ``parallel_min`` of them."""
        verdicts: list[Verdict | None] = [
            self._fast_verdict(s.answer, r) for s, r in zip(samples, responses, strict=True)
        ]
        slow = [(i, samples[i].answer, responses[i]) for i, v in enumerate(verdicts) if v is None]
        pairs = [(answer, response) for _, answer, response in slow]
        if self.params.workers > 1 and len(pairs) >= self.params.parallel_min:
            # contiguous shares keep a prompt's responses (and its parsed answer) together; this process takes the
            # first share while the pool's processes take the others
            size = -(-len(pairs) // self.params.workers)
            shares = [pairs[k : k + size] for k in range(0, len(pairs), size)]
            futures = [self._pool().submit(_verify_pairs, share) for share in shares[1:]]
            slow_verdicts = _verify_pairs(shares[0], self)
            for future in futures:
                slow_verdicts.extend(future.result())
        else:
            slow_verdicts = _verify_pairs(pairs, self)
        for (index, _, _), verdict in zip(slow, slow_verdicts, strict=True):
            verdicts[index] = verdict
        return verdicts  # type: ignore[return-value]  # every slot is filled

    def _fast_verdict(self, answer: str, response: str) -> Verdict | None:
        """:meth:`_verify_slow`'s verdict where it is known without math-verify's comparison, else ``None``.

        Two cases, each shown equal to the slow path by ``test_fast_path_agrees_with_math_verify``: both sides are
        plain integers (math-verify parses them to exact integers: equal iff their values are), or the response is
        the answer itself after the ``strip()`` both paths apply (math-verify parses equal text to equal
        expressions; an answer it cannot parse is compared as text, with that reason).
        """
        answer_text, response_text = answer.strip(), response.strip()
        if _INTEGER.fullmatch(answer_text) and _INTEGER.fullmatch(response_text):
            return Verdict(reward=1.0 if int(answer_text) == int(response_text) else 0.0)
        if response_text != answer_text:
            return None
        if not self._parse_answer(answer):  # the slow path's cache key: the answer as given
            return Verdict(reward=1.0, reason="answer not parseable; compared as text")
        return Verdict(reward=1.0)

    def _pool(self) -> ProcessPoolExecutor:
        """The ``workers - 1`` other processes, started on first use and kept for the verifier's life (a run)."""
        if self._executor is None:
            # spawn: the trainer process holds torch / vLLM threads, which a fork would copy mid-flight
            self._executor = ProcessPoolExecutor(
                self.params.workers - 1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(self.params,),
            )
            weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)
        return self._executor

    def _verify_slow(self, answer: str, response: str) -> Verdict:
        """The reference: math-verify parses both sides and compares them."""
        gold = list(self._parse_answer(answer))
        if not gold:
            reward = 1.0 if response.strip() == answer.strip() else 0.0
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


_WORKER: MathVerifier | None = None  # the verifier of a worker process (:meth:`MathVerifier._pool`)


def _start_worker(params: MathVerifier.Params) -> None:
    global _WORKER
    _WORKER = MathVerifier(params)
    _math_verify()  # import sympy now, while the pool starts, not inside the first batch's timing


def _verify_pairs(pairs: list[tuple[str, str]], verifier: MathVerifier | None = None) -> list[Verdict]:
    """``_verify_slow`` of each ``(answer, response)``; in a worker process with its own verifier, whose tasks run
    in its main thread, so math-verify's SIGALRM timeouts apply there."""
    verifier = verifier if verifier is not None else _WORKER
    assert verifier is not None
    return [verifier._verify_slow(answer, response) for answer, response in pairs]
