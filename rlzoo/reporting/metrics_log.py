"""``metrics.jsonl``: every step's metrics, one JSON object per line; reading it back, torn lines skipped.

How each value combines over minibatches and ranks is declared by its class (:mod:`rlzoo.util.reductions`); the
experiment trackers receive the same rows (:mod:`rlzoo.reporting.trackers`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rlzoo.errors import DataError

log = logging.getLogger(__name__)


def read_metrics(path: Path, need_rows: bool = False) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (JSON objects with an integer ``step``), skipping the other lines.

    A torn *last* line is what a crash in the middle of a write leaves: it is skipped quietly (a debug record; a
    resumed run rewrites the file without it). A bad line with rows after it is not expected, nor an object without
    an integer ``step`` anywhere (no line rlzoo writes): each is skipped with a warning naming the file and its
    1-based line, and the other rows are used. A file that cannot be read at all is a :class:`DataError`; so is,
    with ``need_rows``, a file that holds lines but not one row (naming the first bad line)."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as err:
        raise DataError(f"{path} cannot be read: {err.strerror or err}") from None
    rows: list[dict[str, Any]] = []
    bad: list[tuple[int, str, bool]] = []  # (line, why it is no row, whether it may be a write cut short)
    last = 0  # the last non-blank line
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        last = number
        row, why, torn = _row(raw)
        if row is not None:
            rows.append(row)
        else:
            bad.append((number, why, torn))
    for number, why, torn in bad:
        if number == last and torn:
            log.debug("%s, line %d: cut short (a write interrupted by a crash); skipped", path, number)
        elif rows or not need_rows:
            log.warning("%s, line %d: %s; skipped, the other lines are used", path, number, why)
    if need_rows and not rows and bad:
        number, why, _ = bad[0]
        raise DataError(f"{path} is unreadable: line {number}: {why}, and no line holds a row of metrics")
    return rows


def _row(raw: bytes) -> tuple[dict[str, Any] | None, str, bool]:
    """The row one line holds, or ``None``, why it holds none and whether a write cut short can leave it."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        return None, f"not valid UTF-8 ({err.reason} at byte {err.start})", True
    except json.JSONDecodeError as err:
        return None, f"not a whole JSON object (a torn or corrupted write): {err.msg} (column {err.colno})", True
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object", False
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        found = "none" if step is None else repr(step)
        return None, f'an object without an integer "step" ({found}): not a row rlzoo writes', False
    return row, "", False


class MetricsLogger:
    """``metrics.jsonl``: every step's metrics, one JSON object per line (always written; experiment trackers are
    the ``loggers`` components, :mod:`rlzoo.reporting.trackers`)."""

    def __init__(self, run_dir: Path, keep_below_step: int | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        if keep_below_step is not None:
            # on resume, drop what was logged after the checkpoint: those steps are run again
            rows = [r for r in read_metrics(self.path) if r.get("step", 0) < keep_below_step]
            from rlzoo.util.atomic import atomic_write_text

            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: metrics[k] for k in sorted(metrics)}}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()

    def close(self) -> None:
        pass


class NullMetricsLogger:
    """What the ranks other than 0 of a multi-process run log to: nothing."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
