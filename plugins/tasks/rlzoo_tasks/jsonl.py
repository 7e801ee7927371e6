"""The ``jsonl`` task: prompts and reference answers from a user's JSON-lines file."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


@dataclass(frozen=True)
class Row:
    sample: Sample
    path: Path
    line: int


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def missing_file(path: str | Path) -> str | None:
    """Why ``path`` cannot be read as a data file, or ``None`` when it is an existing file this user may read."""
    path = Path(path).expanduser()
    if (problem := unreadable(path)) is not None:
        return problem
    if path.is_file():
        return None
    what = "is a folder, not a file" if path.is_dir() else "data file not found"
    return f"{path}: {what} (expected an existing JSON-lines file)"


def prompt_lengths(path: str | Path, prompt_field: str) -> Iterator[tuple[str, int]]:
    """``("FILE, line N", characters)`` of each line's string prompt; lines that do not parse are left to
    :func:`load_jsonl` to report."""
    path = Path(path).expanduser()
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                obj = json.loads(raw.decode("utf-8-sig" if line_no == 1 else "utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(obj, dict) and isinstance(obj.get(prompt_field), str):
                yield f"{path}, line {line_no}", len(obj[prompt_field])


def load_jsonl(path: str | Path, prompt_field: str, answer_field: str, demonstration_field: str | None) -> list[Row]:
    """Read and validate every row; the first problem raises :class:`DataError` naming file, line and problem."""
    problem = missing_file(path)
    if problem is not None:
        raise DataError(problem)
    path = Path(path).expanduser()
    rows: list[Row] = []
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{path}, line {line_no}"
            try:
                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{where}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
            if not text.strip():
                continue  # blank lines (e.g. a trailing newline) are allowed
            try:
                obj = json.loads(text.rstrip("\r\n"))  # without the newline: an error's column is on this line
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: invalid JSON: {err.msg} (column {err.colno})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object, got {_type_name(obj)}")
            values: dict[str, str | None] = {}
            for field, required in ((prompt_field, True), (answer_field, True), (demonstration_field, False)):
                if field is None:
                    continue
                if field not in obj:
                    if required:
                        raise DataError(f"{where}: missing field {field!r}")
                    values[field] = None
                    continue
                value = obj[field]
                if not required and value is None:
                    values[field] = None
                elif not isinstance(value, str):
                    raise DataError(f"{where}: field {field!r} must be a string, got {_type_name(value)}")
                else:
                    values[field] = value
            if not values[prompt_field]:
                raise DataError(f"{where}: field {prompt_field!r} is empty")
            meta = {k: v for k, v in obj.items() if k not in (prompt_field, answer_field, demonstration_field)}
            sample = Sample(
                prompt=values[prompt_field],  # type: ignore[arg-type]
                answer=values[answer_field],  # type: ignore[arg-type]
                demonstration=values.get(demonstration_field) if demonstration_field else None,
                meta=meta,
            )
            rows.append(Row(sample, path, line_no))
    if not rows:
        raise DataError(f"{path}: no rows (the file is empty)")
    return rows


@rlzoo.register("task", "jsonl")
class JsonlTask(Task):
    """Prompts and answers from a JSON-lines file: one ``{"prompt": ..., "answer": ...}`` object per line.

    An optional ``demonstration`` (used by cold-start SFT) and any other keys are kept; the other keys go to
    ``Sample.meta`` (e.g. ``tests`` for the code verifier, ``steps`` for the process verifier). Without
    ``eval_path`` the distinct prompts are split deterministically by ``split_seed``: an ``eval_fraction`` of
    them (at least one) forms the eval split, and duplicate prompts always land in the same split. With
    ``eval_path``, a prompt that appears in both files is an error. A malformed row raises ``DataError`` naming
    the file, the 1-based line and the problem.
    """

    default_verifier = "exact"

    class Params(Params):
        path: str = Field(description="the train file (or the whole data set when eval_path is null)")
        eval_path: str | None = Field(None, description="a separate eval file; null splits one off `path`")
        eval_fraction: float = Field(0.1, gt=0, lt=1, description="share of distinct prompts held out for eval")
        split_seed: int = Field(0, description="seed of the train/eval split (independent of the run's seed)")
        prompt_field: str = "prompt"
        answer_field: str = "answer"
        demonstration_field: str | None = Field("demonstration", description="optional field; null ignores it")
        verifier: str = Field("exact", description="the verifier this data is meant for (default_verifier)")

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        # the class-level default is "exact"; an instance reports the verifier its parameters name
        self.default_verifier = self.params.verifier  # type: ignore[misc]

    def check(self) -> list[tuple[str, str]]:
        """The data files exist (their rows are validated when first read)."""
        p = self.params
        return [(field, problem) for field, path in data_files(p) if (problem := missing_file(path)) is not None]

    def preflight(self, run: RunFacts, at: str) -> list[tuple[str, str]]:
        """Also, where it is cheap (the cold start's character tokenizer, files up to ``MEASURE_BYTES``), that every
        prompt fits the model's context beside the response (``rlzoo_tasks._common.char_budget``)."""
        problems = super().preflight(run, at)
        p = self.params
        if char_budget(run) is None:
            return problems
        for field, path in data_files(p):
            if missing_file(path) is None and Path(path).expanduser().stat().st_size <= MEASURE_BYTES:
                if (problem := overlong_problem(prompt_lengths(path, p.prompt_field), run)) is not None:
                    problems.append((f"{at}.{field}", problem))
        return problems

    def _load(self, path: str) -> list[Row]:
        p = self.params
        return load_jsonl(path, p.prompt_field, p.answer_field, p.demonstration_field)

    @functools.cached_property
    def splits(self) -> dict[str, list[Sample]]:
        p = self.params
        rows = self._load(p.path)
        if p.eval_path is not None:
            eval_rows = self._load(p.eval_path)
            first_line = {}
            for row in rows:
                first_line.setdefault(row.sample.prompt, row.line)
            for row in eval_rows:
                if row.sample.prompt in first_line:
                    raise DataError(
                        f"{row.path}, line {row.line}: prompt also appears in the train file {p.path} "
                        f"(line {first_line[row.sample.prompt]}); train and eval must not share prompts"
                    )
            return {"train": [r.sample for r in rows], "eval": [r.sample for r in eval_rows]}
        prompts = list(dict.fromkeys(r.sample.prompt for r in rows))
        if len(prompts) < 2:
            raise DataError(f"{p.path}: needs at least 2 distinct prompts to split off an eval set (or set eval_path)")
        rng_for("rlzoo_tasks", self.name, "split", p.split_seed).shuffle(prompts)
        n_eval = min(len(prompts) - 1, max(1, round(p.eval_fraction * len(prompts))))
        held_out = set(prompts[:n_eval])
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
