"""``metrics.jsonl``: every step's metrics, one JSON object per line; reading it back, torn lines skipped.

How each value combines over minibatches and ranks is declared by its class (:mod:`rlzoo.util.reductions`); the
experiment trackers receive the same rows (:mod:`rlzoo.reporting.trackers`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``, skipping the lines that are not a whole JSON object.

    A torn *last* line is what a crash in the middle of a write leaves: it is skipped quietly (a debug record; a
    resumed run rewrites the file without it). A bad line with rows after it is not expected: it is skipped with a
    warning naming the file and its 1-based line, and the rows after it are used."""
    path = Path(path)
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    last = 0  # the last non-blank line
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        last = number
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(number)
    for number in bad:
        if number == last:
            log.debug("%s, line %d: cut short (a write interrupted by a crash); skipped", path, number)
        else:
            log.warning("%s, line %d: not a whole JSON object (a torn or corrupted write); skipped, the other "
                        "lines are used", path, number)
    return rows


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
