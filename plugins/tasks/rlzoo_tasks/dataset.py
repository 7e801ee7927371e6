"""The ``dataset`` task: prompts and reference answers from local data files read with Hugging Face ``datasets``.

Formats: JSON lines / JSON (``.jsonl``, ``.json``), Parquet (``.parquet``), Arrow (``.arrow``), and folders written
by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``. Nothing is downloaded: only local paths are read.

Layouts (``layout``):

- ``fields``: a prompt field (a string, or a list of chat messages ``{role, content}``), an answer field and an
  optional demonstration field, named by ``prompt_field`` / ``answer_field`` / ``demonstration_field``
  (``a.b`` reaches into a nested record);
- ``verl``: verl's RL data (``examples/data_preprocess`` in verl): ``prompt`` a list of chat messages,
  ``reward_model.ground_truth`` the answer, ``data_source`` / ``ability`` / ``extra_info`` kept in ``Sample.meta``;
  its default verifier is ``math``. A field set (not null) overrides the layout's.

Chat messages become ``Sample.messages`` and are rendered by the tokenizer's chat template (:mod:`rlzoo.episodes.prompts`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

import rlzoo
from rlzoo.errors import DataError
from rlzoo.interfaces import Params, Sample, Task
from rlzoo_tasks._common import (
    MEASURE_BYTES,
    char_budget,
    check_count,
    check_split,
    data_files,
    overlong_problem,
    rng_for,
    take,
    unreadable,
)

if TYPE_CHECKING:
    from rlzoo.interfaces import RunFacts

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
LAYOUTS = {
    "fields": {
        "prompt_field": "prompt",
        "answer_field": "answer",
        "demonstration_field": "demonstration",
        "verifier": "exact",
    },
    "verl": {
        "prompt_field": "prompt",
        "answer_field": "reward_model.ground_truth",
        "demonstration_field": None,
        "verifier": "math",
    },
}
INSTALL_HINT = "pip install datasets (a dependency of rlzoo-tasks: bash scripts/install.sh installs it)"


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def path_problem(path: str, fmt: str) -> str | None:
    """Why ``path`` cannot be read in format ``fmt``, or ``None``; looks at the path only, never reads the data."""
    p = Path(path).expanduser()
    if (problem := unreadable(p)) is not None:
        return problem
    if p.is_dir():
        return None if fmt in ("auto", "arrow") else f"{p} is a folder; format {fmt!r} needs a file (folders: auto)"
    if not p.exists():
        return (
            f"{p}: data file not found (expected a local .jsonl, .json, .parquet or .arrow file, or a folder "
            "written by save_to_disk)"
        )
    if fmt == "auto" and p.suffix not in BUILDERS:
        return (
            f"{p}: cannot tell the format from the suffix {p.suffix!r}; name it .jsonl/.json/.parquet/.arrow "
            "or set format: json, parquet or arrow"
        )
    return None


def read_records(path: str, fmt: str, hf_split: str, cache_dir: str | None) -> list[dict[str, Any]]:
    """Every record of a local data file or ``save_to_disk`` folder, as Python dicts.

    A file that cannot be read raises one :class:`DataError`: for JSON / JSON lines naming the 1-based line that is
    not valid UTF-8 or not valid JSON, for a string column that is not valid UTF-8 the 1-based row, otherwise
    with the reader's own message after the file name (``datasets``' log of it is silenced: it would repeat it)."""
    problem = path_problem(path, fmt)
    if problem is not None:
        raise DataError(problem)
    import datasets

    p = Path(path).expanduser()
    datasets.disable_progress_bars()
    builder = None if p.is_dir() else BUILDERS[p.suffix] if fmt == "auto" else fmt
    data = None
    try:
        with _quiet("datasets"):  # its ERROR records would repeat what the DataError says
            if p.is_dir():
                data = datasets.load_from_disk(str(p))
                if isinstance(data, datasets.DatasetDict):
                    if hf_split not in data:
                        raise DataError(
                            f"{p}: no split {hf_split!r} in this saved DatasetDict; hf_split: one of {', '.join(data)}"
                        )
                    data = data[hf_split]
            else:
                data = datasets.load_dataset(builder, data_files=str(p), split="train", cache_dir=cache_dir)
            return data.to_list()  # strings are decoded here: bytes that are not UTF-8 fail here
    except DataError:
        raise
    except Exception as err:  # datasets/pyarrow raise many types for unreadable files; name the file either way
        where = json_file_problem(p) if builder == "json" and p.is_file() else None
        if where is None and isinstance(err, UnicodeDecodeError) and data is not None:
            where = _undecodable_row(data, p)
        if where is not None:
            raise DataError(where) from None
        cause = err.__cause__ if type(err).__name__ == "DatasetGenerationError" and err.__cause__ else err
        raise DataError(
            f"{p}: cannot be read as {fmt if fmt != 'auto' else 'data'}: {type(cause).__name__}: {cause}"
        ) from None


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Logger ``name`` (and its children) silent below CRITICAL while the block runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def json_file_problem(path: Path) -> str | None:
    """``"FILE, line N: ..."`` for the first line of a JSON lines / JSON file that is not valid UTF-8 or not valid
    JSON (a ``.json`` file holding one document: where that document breaks), or ``None`` if every line parses."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line, start = raw.count(b"\n", 0, err.start) + 1, raw.rfind(b"\n", 0, err.start) + 1
        return f"{path}, line {line}: not valid UTF-8 ({err.reason} at byte {err.start - start})"
    if path.suffix != ".jsonl":  # a .json file may hold one JSON document
        try:
            json.loads(text)
            return None  # it parses: what the reader refused is in its own message
        except json.JSONDecodeError as err:
            if text.lstrip().startswith("["):  # a list of records: where the document breaks
                return f"{path}, line {err.lineno}: invalid JSON: {err.msg} (column {err.colno})"
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            try:
                json.loads(line)
            except json.JSONDecodeError as err:
                return f"{path}, line {number}: invalid JSON: {err.msg} (column {err.colno})"
    return None


def _undecodable_row(data: Any, path: Path) -> str | None:
    """``"FILE, row N: ..."`` for the first row (1-based) holding a string that is not valid UTF-8."""
    chunk = 1024
    for start in range(0, len(data), chunk):
        try:
            data.select(range(start, min(start + chunk, len(data)))).to_list()
            continue
        except UnicodeDecodeError:
            pass
        for index in range(start, min(start + chunk, len(data))):
            try:
                data.select([index]).to_list()
            except UnicodeDecodeError as err:
                return f"{path}, row {index + 1}: a string that is not valid UTF-8 ({err.reason})"
    return None


def prompt_lengths(path: Path, prompt_field: str) -> Iterator[tuple[str, int]]:
    """``("FILE, line N" or "FILE, row N", characters)`` of each string prompt of a JSON lines / JSON file; what does
    not parse is left to :func:`read_records` to report."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return
    if path.suffix != ".jsonl" and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError:
            return
        numbered = ((f"{path}, row {i}", r) for i, r in enumerate(records if isinstance(records, list) else [], 1))
    else:
        numbered = ((f"{path}, line {i}", _parsed(line)) for i, line in enumerate(text.split("\n"), 1))
    for where, record in numbered:
        found, prompt = field_value(record, prompt_field) if isinstance(record, dict) else (False, None)
        if found and isinstance(prompt, str):
            yield where, len(prompt)


def _parsed(line: str) -> Any:
    try:
        return json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        return None


def field_value(record: dict[str, Any], name: str) -> tuple[bool, Any]:
    """``(found, value)`` of field ``name``; dots reach into nested records (``reward_model.ground_truth``)."""
    value: Any = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def messages_of(value: Any, where: str, field: str) -> list[dict[str, str]]:
    if not value:
        raise DataError(f"{where}: field {field!r} is an empty list of chat messages")
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(
                f"{where}: field {field!r} message {i} must be an object with string 'role' and "
                f"'content', got {m!r:.80}"
            )
        messages.append({"role": m["role"], "content": m["content"]})
    return messages


@dataclass(frozen=True)
class Row:
    sample: Sample
    number: int  # 1-based row of its file


def to_rows(
    records: list[dict[str, Any]], path: str, prompt_field: str, answer_field: str, demonstration_field: str | None
) -> list[Row]:
    """Validate every record; the first problem raises :class:`DataError` naming file, row and field."""
    rows = []
    top_level = {f.split(".")[0] for f in (prompt_field, answer_field, demonstration_field) if f}
    for number, record in enumerate(records, start=1):
        where = f"{path}, row {number}"
        found, prompt = field_value(record, prompt_field)
        if not found or prompt is None:  # Arrow gives a column missing from some rows as null
            raise DataError(f"{where}: missing field {prompt_field!r} (or null)")
        messages = None
        if isinstance(prompt, list):
            messages = messages_of(prompt, where, prompt_field)
            prompt = "\n".join(m["content"] for m in messages)
        elif not isinstance(prompt, str):
            raise DataError(
                f"{where}: field {prompt_field!r} must be a string or a list of chat messages, got {_type_name(prompt)}"
            )
        if not prompt:
            raise DataError(f"{where}: field {prompt_field!r} is empty")
        found, answer = field_value(record, answer_field)
        if not found or answer is None:
            raise DataError(f"{where}: missing field {answer_field!r} (or null)")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)  # verl ground truths are sometimes numbers
        if not isinstance(answer, str):
            raise DataError(f"{where}: field {answer_field!r} must be a string or a number, got {_type_name(answer)}")
        demonstration = None
        if demonstration_field is not None:
            _, demonstration = field_value(record, demonstration_field)
            if demonstration is not None and not isinstance(demonstration, str):
                raise DataError(
                    f"{where}: field {demonstration_field!r} must be a string or null, got {_type_name(demonstration)}"
                )
        meta = {k: v for k, v in record.items() if k not in top_level}
        rows.append(Row(Sample(prompt, answer, demonstration, meta, messages), number))
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


@rlzoo.register("task", "dataset")
class DatasetTask(Task):
    """Prompts and answers from local data files (JSON lines, JSON, Parquet, Arrow) via Hugging Face ``datasets``.

    ``task: {name: dataset, path: train.parquet, eval_path: test.parquet, layout: verl}`` reads verl's data as it
    is. Without ``eval_path`` the distinct prompts are split deterministically by ``split_seed`` (an
    ``eval_fraction`` of them, at least one, is held out; duplicates land in the same split); with ``eval_path`` a
    prompt in both files is an error. A malformed row raises ``DataError`` naming file, 1-based row and field.
    """

    requires = ("datasets",)
    install_hint = INSTALL_HINT

    class Params(Params):
        path: str = Field(description="the train file or save_to_disk folder (the whole data set without eval_path)")
        eval_path: str | None = Field(None, description="a separate eval file or folder; null splits one off `path`")
        format: Literal["auto", "json", "parquet", "arrow"] = Field(
            "auto", description="auto: by suffix (.jsonl/.json, .parquet, .arrow; a folder: save_to_disk)"
        )
        hf_split: str = Field("train", description="the split read from a saved DatasetDict folder")
        layout: Literal["fields", "verl"] = Field("fields", description="field names and default verifier")
        prompt_field: str | None = Field(None, description="null: the layout's (fields: prompt; verl: prompt)")
        answer_field: str | None = Field(
            None, description="null: the layout's (fields: answer; verl: reward_model.ground_truth)"
        )
        demonstration_field: str | None = Field(
            None, description="null: the layout's (fields: demonstration; verl: none); missing in a row: none"
        )
        verifier: str | None = Field(None, description="null: the layout's (fields: exact; verl: math)")
        eval_fraction: float = Field(0.1, gt=0, lt=1, description="share of distinct prompts held out for eval")
        split_seed: int = Field(0, description="seed of the train/eval split (independent of the run's seed)")
        cache_dir: str | None = Field(None, description="datasets' cache folder; null: its default")

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        p, layout = self.params, LAYOUTS[self.params.layout]
        # a null field is the layout's (the resolved config writes every parameter out, nulls included)
        self.fields = {
            key: getattr(p, key) if getattr(p, key) is not None else layout[key]
            for key in ("prompt_field", "answer_field", "demonstration_field")
        }
        self.default_verifier = p.verifier or layout["verifier"]  # type: ignore[misc]

    def chat_prompts(self) -> bool:
        return self.params.layout == "verl"

    def check(self) -> list[tuple[str, str]]:
        """``datasets`` is installed and the data paths exist in a readable format (rows are checked on reading)."""
        p = self.params
        problems = []
        if importlib.util.find_spec("datasets") is None:
            problems.append(
                ("name", f"'dataset' needs the Python package 'datasets', which is not installed ({INSTALL_HINT})")
            )
        problems += [(field, problem) for field, path in data_files(p) if (problem := path_problem(path, p.format))]
        return problems

    def preflight(self, run: RunFacts, at: str) -> list[tuple[str, str]]:
        """Also, where it is cheap (the cold start's character tokenizer, JSON lines / JSON files up to
        ``MEASURE_BYTES``), that every plain prompt fits the model's context beside the response."""
        problems = super().preflight(run, at)
        p = self.params
        if char_budget(run) is None:
            return problems
        for field, path in data_files(p):
            file = Path(path).expanduser()
            json_file = p.format == "json" or (p.format == "auto" and BUILDERS.get(file.suffix) == "json")
            if (
                json_file
                and path_problem(path, p.format) is None
                and file.is_file()
                and file.stat().st_size <= MEASURE_BYTES
            ):
                lengths = prompt_lengths(file, self.fields["prompt_field"])
                if (problem := overlong_problem(lengths, run)) is not None:
                    problems.append((f"{at}.{field}", problem))
        return problems

    def _load(self, path: str) -> list[Row]:
        p = self.params
        records = read_records(path, p.format, p.hf_split, p.cache_dir)
        return to_rows(
            records, path, self.fields["prompt_field"], self.fields["answer_field"], self.fields["demonstration_field"]
        )

    @functools.cached_property
    def splits(self) -> dict[str, list[Sample]]:
        p = self.params
        rows = self._load(p.path)
        if p.eval_path is not None:
            eval_rows = self._load(p.eval_path)
            first = {}
            for row in rows:
                first.setdefault(row.sample.prompt, row.number)
            for row in eval_rows:
                if row.sample.prompt in first:
                    raise DataError(
                        f"{p.eval_path}, row {row.number}: prompt also appears in the train file {p.path} (row "
                        f"{first[row.sample.prompt]}); train and eval must not share prompts"
                    )
            return {"train": [r.sample for r in rows], "eval": [r.sample for r in eval_rows]}
        prompts = list(dict.fromkeys(r.sample.prompt for r in rows))
        if len(prompts) < 2:
            raise DataError(f"{p.path}: needs at least 2 distinct prompts to split off an eval set (or set eval_path)")
        rng_for("rlzoo_tasks", self.name, "split", p.split_seed).shuffle(prompts)
        held_out = set(prompts[: min(len(prompts) - 1, max(1, round(p.eval_fraction * len(prompts))))])
        return {
            "train": [r.sample for r in rows if r.sample.prompt not in held_out],
            "eval": [r.sample for r in rows if r.sample.prompt in held_out],
        }

    def samples(self, split: str, count: int | None, seed: int) -> list[Sample]:
        check_split(split)
        check_count(count)
        pool = self.splits[split]
        return take(pool, len(pool) if count is None else count, rng_for("rlzoo_tasks", self.name, split, seed))

    def alphabet(self) -> str:
        chars: set[str] = set()
        for pool in self.splits.values():
            for s in pool:
                chars.update(s.prompt, s.answer, s.demonstration or "")
        return "".join(sorted(chars))
