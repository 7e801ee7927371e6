"""The jsonl task: loading a good file, deterministic disjoint splits, and one error per kind of malformed row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlzoo.errors import DataError
from rlzoo_tasks.jsonl import JsonlTask


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def rows(n: int, start: int = 0) -> list[str]:
    return [
        json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i), "demonstration": f"{2 * i}", "level": i % 3})
        for i in range(start, start + n)
    ]


def task(path: Path, **params) -> JsonlTask:
    return JsonlTask(JsonlTask.Params(path=str(path), **params))


def test_good_file_loads_with_meta_and_demonstrations(tmp_path):
    t = task(write(tmp_path / "d.jsonl", rows(50) + [""]))  # a blank line is allowed
    train, ev = t.samples("train", None, 0), t.samples("eval", None, 0)
    assert len(train) == 45 and len(ev) == 5
    for s in train + ev:
        assert s.answer == str(eval(s.prompt[:-1]))  # noqa: S307
        assert s.demonstration == s.answer
        assert set(s.meta) == {"level"}
    assert t.default_verifier == "exact"


def test_splits_are_disjoint_and_deterministic(tmp_path):
    path = write(tmp_path / "d.jsonl", rows(40) + rows(10))  # 10 duplicated prompts
    t = task(path, eval_fraction=0.25)
    for seed_a in (0, 1):
        for seed_b in (0, 3):
            train = {s.prompt for s in t.samples("train", None, seed_a)}
            ev = {s.prompt for s in t.samples("eval", None, seed_b)}
            assert not train & ev
            assert len(train | ev) == 40
    assert t.samples("train", 20, 5) == task(path, eval_fraction=0.25).samples("train", 20, 5)
    assert t.samples("train", 20, 5) != t.samples("train", 20, 6)
    other = task(path, eval_fraction=0.25, split_seed=1)
    assert {s.prompt for s in other.samples("eval", None, 0)} != {s.prompt for s in t.samples("eval", None, 0)}


def test_count_beyond_split_repeats_and_zero_is_empty(tmp_path):
    t = task(write(tmp_path / "d.jsonl", rows(10)))
    many = t.samples("train", 25, 0)
    assert len(many) == 25 and len({s.prompt for s in many}) == 9
    assert t.samples("eval", 0, 0) == []


def test_separate_eval_file(tmp_path):
    t = task(write(tmp_path / "train.jsonl", rows(20)), eval_path=str(write(tmp_path / "eval.jsonl", rows(5, 100))))
    assert len(t.samples("train", None, 0)) == 20
    assert {s.prompt for s in t.samples("eval", None, 0)} == {f"{i}+{i}=" for i in range(100, 105)}


def test_separate_eval_file_sharing_a_prompt_is_an_error(tmp_path):
    t = task(write(tmp_path / "train.jsonl", rows(20)), eval_path=str(write(tmp_path / "eval.jsonl", rows(3, 18))))
    with pytest.raises(DataError, match=r"eval\.jsonl, line 1: prompt also appears in the train file .*line 19"):
        t.samples("eval", None, 0)


def test_alphabet_covers_everything(tmp_path):
    lines = [
        json.dumps({"prompt": "Ünïcode? ", "answer": "ok", "demonstration": "ok\tß"}),
        json.dumps({"prompt": "x;y=", "answer": "-1"}),
        json.dumps({"prompt": "{}", "answer": "[]", "demonstration": None}),
    ]
    t = task(write(tmp_path / "d.jsonl", lines))
    alphabet = t.alphabet()
    assert set("Ünïcode? okß\tx;y=-1{}[]") == set(alphabet)
    assert len(alphabet) == len(set(alphabet))


def test_custom_field_names_and_verifier_hint(tmp_path):
    lines = [json.dumps({"q": f"q{i}", "a": f"a{i}", "tests": "assert True"}) for i in range(5)]
    t = task(write(tmp_path / "d.jsonl", lines), prompt_field="q", answer_field="a", verifier="code")
    s = t.samples("train", 1, 0)[0]
    assert s.prompt.startswith("q") and s.answer.startswith("a") and s.meta == {"tests": "assert True"}
    assert s.demonstration is None
    assert t.default_verifier == "code"


GOOD = json.dumps({"prompt": "1+1=", "answer": "2"})


@pytest.mark.parametrize(
    "bad,problem",
    [
        ('{"prompt": "1+1=", "answer": "2"', "invalid JSON"),
        ("not json at all", "invalid JSON"),
        ('["1+1=", "2"]', "expected a JSON object, got an array"),
        ('"just a string"', "expected a JSON object, got a string"),
        ('{"answer": "2"}', "missing field 'prompt'"),
        ('{"prompt": "1+1="}', "missing field 'answer'"),
        ('{"prompt": 11, "answer": "2"}', "field 'prompt' must be a string, got a number"),
        ('{"prompt": "1+1=", "answer": 2}', "field 'answer' must be a string, got a number"),
        ('{"prompt": null, "answer": "2"}', "field 'prompt' must be a string, got null"),
        ('{"prompt": "", "answer": "2"}', "field 'prompt' is empty"),
        ('{"prompt": "1+1=", "answer": "2", "demonstration": ["2"]}', "field 'demonstration' must be a string"),
    ],
)
def test_malformed_row_names_file_line_and_problem(tmp_path, bad, problem):
    path = write(tmp_path / "broken.jsonl", [GOOD, "", GOOD, bad, GOOD])
    with pytest.raises(DataError) as info:
        task(path).samples("train", None, 0)
    message = str(info.value)
    assert str(path) in message
    assert "line 4:" in message  # 1-based, blank lines counted
    assert problem in message


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"prompt": "\xff", "answer": "1"}\n')
    with pytest.raises(DataError, match=r"bin\.jsonl, line 2: not valid UTF-8"):
        task(path).alphabet()


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_an_error(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=r"empty\.jsonl: no rows"):
        task(path).samples("train", 1, 0)


def test_missing_file_and_single_prompt_are_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        task(tmp_path / "nope.jsonl").samples("train", 1, 0)
    with pytest.raises(DataError, match="at least 2 distinct prompts"):
        task(write(tmp_path / "one.jsonl", [GOOD, GOOD])).samples("train", 1, 0)


def test_check_names_missing_files_without_reading_them(tmp_path):
    good = write(tmp_path / "train.jsonl", rows(4))
    assert task(good).check() == []
    assert task(good, eval_path=str(good)).check() == []
    problems = task(tmp_path / "nope.jsonl", eval_path=str(tmp_path)).check()
    assert [field for field, _ in problems] == ["path", "eval_path"]
    assert "data file not found" in problems[0][1] and "is a folder" in problems[1][1]
    bad = write(tmp_path / "bad.jsonl", ["not json"])
    assert task(bad).check() == []  # rows are validated when the data is read, not by the cheap check


def test_generated_tasks_have_nothing_to_check():
    from rlzoo_tasks.arithmetic import ArithmeticTask

    assert ArithmeticTask().check() == []
