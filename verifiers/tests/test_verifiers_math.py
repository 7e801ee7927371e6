"""The math verifier (math-verify): numbers, expressions, prose, the echo guard, threads, and speed."""

from __future__ import annotations

import threading
import time

import pytest

from rlzoo.interfaces import Sample
from rlzoo_verifiers.math import MathVerifier

V = MathVerifier()


def reward(answer: str, response: str, verifier: MathVerifier = V) -> float:
    return verifier.verify(Sample("p", answer), response).reward


@pytest.mark.parametrize(
    "answer,response",
    [
        ("46", "46"),
        ("46", " 46\n"),
        ("46", "46.0"),
        ("46", "The answer is 46"),
        ("46", "$46$"),
        ("46", "\\boxed{46}"),
        ("0", "0"),
        ("-3", "-3"),
        ("1000", "1,000"),
        ("1/2", "0.5"),
        ("\\frac{1}{2}", "1/2"),
        ("0.5", "\\frac{1}{2}"),
        ("1024", "1024"),
        ("2^{10}", "1024"),
        ("x^2+1", "1+x^2"),
        ("\\sqrt{2}", "\\sqrt{2}"),
    ],
)
def test_equal_answers_score(answer, response):
    assert reward(answer, response) == 1.0


@pytest.mark.parametrize(
    "answer,response",
    [
        ("46", "47"),
        ("46", "-46"),
        ("46", "4.6"),
        ("46", "46 47"),
        ("46", "46;47"),
        ("46", ""),
        ("46", "abc"),
        ("1/2", "2"),
        ("x^2+1", "x^2"),
    ],
)
def test_different_answers_do_not_score(answer, response):
    assert reward(answer, response) == 0.0


def test_echoing_the_problem_does_not_score_a_numeric_answer():
    assert reward("46", "12+34") == 0.0
    assert reward("46", "$12+34$") == 0.0
    assert reward("1024", "2^{10}") == 0.0
    lenient = MathVerifier(MathVerifier.Params(numbers_only=False))
    assert reward("46", "12+34", lenient) == 1.0


def test_no_answer_found_has_a_reason():
    v = V.verify(Sample("p", "46"), "")
    assert v.reward == 0.0 and v.reason == "no answer found in response"


def test_unparseable_answer_falls_back_to_text():
    assert reward("%%%", " %%% ") == 1.0  # math-verify keeps unparseable text as a string and compares it
    assert reward("%%%", "%%") == 0.0
    v = V.verify(Sample("p", ""), "  ")  # nothing to parse at all: plain text comparison
    assert v.reward == 1.0 and "text" in v.reason
    assert reward("", "0") == 0.0


def test_works_outside_the_main_thread():
    results: list[float] = []
    errors: list[BaseException] = []

    def work():
        try:
            results.extend([reward("46", "46"), reward("46", "47"), reward("\\frac{1}{2}", "0.5")])
        except BaseException as err:  # pragma: no cover - the failure being tested for
            errors.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert not errors and results == [1.0, 0.0, 1.0]


def test_arithmetic_demonstrations_score():
    tasks = pytest.importorskip("rlzoo_tasks")
    task = tasks.ArithmeticTask(tasks.ArithmeticTask.Params(digits=3, operations=["+", "-", "*"]))
    for s in task.samples("train", 100, 0):
        assert V.verify(s, s.demonstration).reward == 1.0
        assert V.verify(s, str(int(s.answer) + 1)).reward == 0.0
        assert V.verify(s, s.prompt[:-1]).reward == 0.0  # the echoed problem


def test_fast_enough_for_a_training_step():
    V.verify(Sample("p", "1"), "1")  # import math-verify and sympy outside the timing
    samples = [Sample("p", str(1000 + i)) for i in range(100)]
    start = time.perf_counter()
    for i, s in enumerate(samples):
        V.verify(s, s.answer if i % 2 else str(i))
    per_call = (time.perf_counter() - start) / len(samples)
    assert per_call < 0.05, f"{per_call * 1e3:.1f} ms per call"  # measured ~1 ms on 2 shared CPU cores
