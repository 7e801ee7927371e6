"""The exact, regex and process verifiers on right, wrong and edge-case responses."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlzoo.errors import DataError
from rlzoo.interfaces import Sample, Verdict
from rlzoo_verifiers.exact import ExactVerifier
from rlzoo_verifiers.process import ProcessVerifier
from rlzoo_verifiers.regex import RegexVerifier


def rewards(verifier, sample, responses):
    return [verifier.verify(sample, r).reward for r in responses]


# -- exact ------------------------------------------------------------------------------------------------------


def test_exact_strips_by_default():
    s = Sample("12+34=", "46")
    assert rewards(ExactVerifier(), s, ["46", " 46\n", "\t46 "]) == [1.0, 1.0, 1.0]
    assert rewards(ExactVerifier(), s, ["47", "046", "46.0", "4 6", "", "46;"]) == [0.0] * 6
    assert ExactVerifier().verify(Sample("p", " 46 "), "46") == Verdict(reward=1.0)


def test_exact_without_strip_is_literal():
    v = ExactVerifier(ExactVerifier.Params(strip=False))
    assert rewards(v, Sample("p", "46"), ["46", "46\n", " 46"]) == [1.0, 0.0, 0.0]


def test_exact_empty_answer():
    assert rewards(ExactVerifier(), Sample("p", ""), ["", "  ", "x"]) == [1.0, 1.0, 0.0]


# -- regex ------------------------------------------------------------------------------------------------------


def test_regex_fullmatch_and_search():
    s = Sample("p", "ignored")
    full = RegexVerifier(RegexVerifier.Params(pattern=r"\d+(;\d+)*"))
    assert rewards(full, s, ["8;6;10", "8", "8;6;", "x8;6", ""]) == [1.0, 1.0, 0.0, 0.0, 0.0]
    anywhere = RegexVerifier(RegexVerifier.Params(pattern=r"<answer>.*</answer>", fullmatch=False, reward=0.5))
    assert rewards(anywhere, s, ["think <answer>4</answer> done", "<answer>4", ""]) == [0.5, 0.0, 0.0]


def test_regex_inline_flags():
    v = RegexVerifier(RegexVerifier.Params(pattern=r"(?s)<think>.*</think>\d+"))
    assert rewards(v, Sample("p", ""), ["<think>a\nb</think>42", "<think>a</think>x"]) == [1.0, 0.0]


def test_regex_params_are_validated():
    with pytest.raises(ValidationError, match="invalid regular expression"):
        RegexVerifier.Params(pattern="(unclosed")
    with pytest.raises(ValidationError, match="pattern"):
        RegexVerifier.Params()
    with pytest.raises(ValidationError):
        RegexVerifier.Params(pattern="x", full_match=False)  # typo


# -- process ----------------------------------------------------------------------------------------------------

CHAIN = Sample("5+3-2+4=", "10", "8;6;10", {"steps": ["8", "6", "10"]})


def spans_text(response: str, verdict: Verdict) -> list[str]:
    return [response[a:b] for a, b in verdict.step_spans]


def test_process_all_steps_right():
    v = ProcessVerifier().verify(CHAIN, "8;6;10")
    assert v.reward == 1.0 and v.step_rewards == [1.0, 1.0, 1.0] and v.reason is None
    assert v.step_spans == [(0, 1), (2, 3), (4, 6)]


def test_process_wrong_intermediate_step():
    v = ProcessVerifier().verify(CHAIN, "8;7;10")
    assert v.step_rewards == [1.0, 0.0, 1.0]
    assert v.reward == 1.0  # outcome: right number of steps and right final value


def test_process_wrong_final_value():
    v = ProcessVerifier().verify(CHAIN, "8;6;11")
    assert v.reward == 0.0 and v.step_rewards == [1.0, 1.0, 0.0] and v.reason == "wrong final value"


def test_process_missing_and_extra_steps():
    short = ProcessVerifier().verify(CHAIN, "8;6")
    assert short.reward == 0.0 and short.step_rewards == [1.0, 1.0] and len(short.step_spans) == 2
    assert short.reason == "2 steps, expected 3"
    final_only = ProcessVerifier().verify(CHAIN, "10")
    assert final_only.reward == 0.0 and final_only.step_rewards == [0.0]
    extra = ProcessVerifier().verify(CHAIN, "8;6;10;12")
    assert extra.reward == 0.0 and extra.step_rewards == [1.0, 1.0, 1.0, 0.0]
    trailing = ProcessVerifier().verify(CHAIN, "8;6;10;")
    assert trailing.reward == 0.0 and trailing.step_rewards == [1.0, 1.0, 1.0, 0.0]
    assert trailing.step_spans[-1] == (7, 7)


def test_process_spans_point_at_the_steps():
    response = " 8 ;6;  10\n"
    v = ProcessVerifier().verify(CHAIN, response)
    assert spans_text(response, v) == ["8", "6", "10"]
    assert v.reward == 1.0 and v.step_rewards == [1.0, 1.0, 1.0]
    garbled = "x;;8;6"
    v = ProcessVerifier().verify(CHAIN, garbled)
    assert spans_text(garbled, v) == ["x", "", "8", "6"]
    assert v.step_rewards == [0.0, 0.0, 0.0, 0.0]


def test_process_empty_response_has_no_steps():
    for response in ("", "   "):
        v = ProcessVerifier().verify(CHAIN, response)
        assert v.reward == 0.0 and v.step_rewards == [] and v.step_spans == []


def test_process_numeric_steps_in_meta_and_custom_separator():
    s = Sample("p", "3", meta={"steps": [1, 3]})
    assert ProcessVerifier().verify(s, "1;3").reward == 1.0
    v = ProcessVerifier(ProcessVerifier.Params(separator=" -> "))
    assert v.verify(s, "1 -> 3").step_rewards == [1.0, 1.0]


def test_process_needs_steps():
    with pytest.raises(DataError, match=r"meta\['steps'\]"):
        ProcessVerifier().verify(Sample("p", "1"), "1")


def test_process_scores_chain_demonstrations():
    tasks = pytest.importorskip("rlzoo_tasks")
    task = tasks.ChainTask(tasks.ChainTask.Params(terms=5))
    for s in task.samples("train", 50, 0):
        v = ProcessVerifier().verify(s, s.demonstration)
        assert v.reward == 1.0 and v.step_rewards == [1.0] * 4
        assert ProcessVerifier().verify(s, s.answer).reward == 0.0
