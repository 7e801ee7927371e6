"""The dataset task: every local format, field mapping, verl's layout, splits, and one error per malformed row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from rlzoo.errors import DataError  # noqa: E402
from rlzoo_tasks.dataset import DatasetTask  # noqa: E402


def verl_records(n: int, start: int = 0) -> list[dict]:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}? Put the answer in \\boxed{{}}."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(start, start + n)
    ]


def plain_records(n: int) -> list[dict]:
    return [{"question": f"{i}*3=", "solution": {"final": 3 * i}, "level": i % 2} for i in range(n)]


def write(path: Path, records: list[dict]) -> Path:
    ds = datasets.Dataset.from_list(records)
    if path.suffix == ".parquet":
        ds.to_parquet(str(path))
    elif path.suffix == ".jsonl":
        ds.to_json(str(path), lines=True)
    elif path.suffix == ".json":
        path.write_text(json.dumps(records))
    else:
        ds.save_to_disk(str(path))
    return path


def task(path: Path, tmp_path: Path, **params) -> DatasetTask:
    return DatasetTask(DatasetTask.Params(path=str(path), cache_dir=str(tmp_path / "cache"), **params))


def test_nulls_from_a_resolved_config_mean_the_layouts_fields(tmp_path):
    from rlzoo.registry import default_registry

    path = write(tmp_path / "train.parquet", verl_records(4))
    params = default_registry().validate_params("task", "dataset", {"path": str(path), "layout": "verl"}, "task")
    t = DatasetTask(DatasetTask.Params(**params.model_dump(mode="json")))  # every parameter written out
    assert t.fields["answer_field"] == "reward_model.ground_truth" and t.default_verifier == "math"
    assert len(t.samples("train", None, 0)) == 3


def test_verl_parquet_works_with_layout_alone(tmp_path):
    t = task(write(tmp_path / "train.parquet", verl_records(20)), tmp_path, layout="verl")
    assert t.check() == [] and t.chat_prompts() and t.default_verifier == "math"
    train, ev = t.samples("train", None, 0), t.samples("eval", None, 0)
    assert len(train) == 18 and len(ev) == 2
    for s in train + ev:
        assert s.messages and s.messages[0]["role"] == "user"
        i = int(s.messages[0]["content"].split()[2])
        assert s.answer == str(2 * i) and s.demonstration is None
        assert s.meta["data_source"] == "openai/gsm8k" and s.meta["extra_info"]["index"] == i
        assert "prompt" not in s.meta and "reward_model" not in s.meta
    assert not {s.prompt for s in train} & {s.prompt for s in ev}


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.parquet", "folder"])
def test_every_format_with_field_mapping(tmp_path, name):
    t = task(
        write(tmp_path / name, plain_records(10)), tmp_path, prompt_field="question", answer_field="solution.final"
    )
    assert t.check() == [] and not t.chat_prompts() and t.default_verifier == "exact"
    samples = t.samples("train", None, 0) + t.samples("eval", None, 0)
    assert len(samples) == 10
    for s in samples:
        assert s.messages is None and s.answer == str(3 * int(s.prompt[:-3]))  # numbers become strings
        assert set(s.meta) == {"level"}


def test_saved_dataset_dict_folder_and_eval_path(tmp_path):
    folder = tmp_path / "dd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(verl_records(6)),
            "test": datasets.Dataset.from_list(verl_records(3, start=100)),
        }
    ).save_to_disk(str(folder))
    t = task(folder, tmp_path, layout="verl", hf_split="test")
    assert len(t.samples("train", None, 0) + t.samples("eval", None, 0)) == 3
    with pytest.raises(DataError, match="no split 'dev'.*train, test"):
        task(folder, tmp_path, layout="verl", hf_split="dev").samples("train", 1, 0)
    train = write(tmp_path / "train.parquet", verl_records(6))
    t = task(train, tmp_path, layout="verl", eval_path=str(write(tmp_path / "test.parquet", verl_records(3, 100))))
    assert len(t.samples("train", None, 0)) == 6 and len(t.samples("eval", None, 0)) == 3
    clash = task(train, tmp_path, layout="verl", eval_path=str(write(tmp_path / "clash.parquet", verl_records(2, 5))))
    with pytest.raises(DataError, match=r"clash.parquet, row 1: prompt also appears in the train file"):
        clash.samples("train", 1, 0)


def test_check_reports_paths_without_reading(tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n")
    t = task(tmp_path / "missing.parquet", tmp_path, eval_path=str(tmp_path / "d.csv"))
    problems = dict(t.check())
    assert "data file not found" in problems["path"]
    assert "cannot tell the format from the suffix '.csv'" in problems["eval_path"]
    assert "format 'parquet' needs a file" in dict(task(tmp_path, tmp_path, format="parquet").check())["path"]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"answer": "1"}, "missing field 'prompt'"),
        ({"prompt": 3, "answer": "1"}, "field 'prompt' must be a string or a list of chat messages, got a number"),
        (
            {"prompt": [{"role": "user"}], "answer": "1"},
            "field 'prompt' message 0 must be an object with string 'role' and 'content'",
        ),
        ({"prompt": [], "answer": "1"}, "field 'prompt' is an empty list of chat messages"),
        ({"prompt": "", "answer": "1"}, "field 'prompt' is empty"),
        ({"prompt": "x"}, "missing field 'answer'"),
        ({"prompt": "x", "answer": ["1"]}, "field 'answer' must be a string or a number, got a list"),
        ({"prompt": "x", "answer": "1", "demonstration": 5}, "field 'demonstration' must be a string or null"),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, record, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")  # one row: Arrow needs one type per column across rows
    with pytest.raises(DataError) as err:
        task(path, tmp_path).samples("train", 1, 0)
    assert f"{path}, row 1: {message}" in str(err.value)


def test_column_missing_from_some_rows_is_reported_by_row(tmp_path):
    path = tmp_path / "gap.jsonl"
    path.write_text(json.dumps({"prompt": "a", "answer": "1"}) + "\n" + json.dumps({"answer": "2"}) + "\n")
    with pytest.raises(DataError, match=r"gap.jsonl, row 2: missing field 'prompt' \(or null\)"):
        task(path, tmp_path).samples("train", 1, 0)


def test_unreadable_file_is_a_data_error(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="broken.parquet: cannot be read"):
        task(path, tmp_path).samples("train", 1, 0)
