"""Metrics: one JSON object per line in ``metrics.jsonl``, mirrored to TensorBoard when it is installed."""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}


def mean_of(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Average per key; ``*_steps`` counters and ``ratio/min|max`` keep their sum / extreme."""
    out: dict[str, float] = {}
    for key in {k for d in dicts for k in d}:
        values = [d[key] for d in dicts if key in d]
        if key.endswith("_steps"):
            out[key] = float(sum(values))
        elif key == "ratio/min":
            out[key] = min(values)
        elif key == "ratio/max":
            out[key] = max(values)
        else:
            finite = [v for v in values if math.isfinite(v)]
            out[key] = sum(finite) / len(finite) if finite else float("nan")
    return out


def read_metrics(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a crash ends the readable log
    return rows


class MetricsLogger:
    def __init__(self, run_dir: Path, keep_below_step: int | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        if keep_below_step is not None:
            # on resume, drop what was logged after the checkpoint: those steps are run again
            rows = [r for r in read_metrics(self.path) if r.get("step", 0) < keep_below_step]
            from rlzoo.checkpoint import atomic_write_text  # a kill while rewriting must not lose the log

            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))
        self._tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        except Exception:  # TensorBoard is optional
            self._tb = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: metrics[k] for k in sorted(metrics)}}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


class NullMetricsLogger:
    """What the ranks other than 0 of a multi-process run log to: nothing."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
