"""The sweep's progress line over all its runs: done / running / failed, with tqdm's rate and ETA."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

from rlzoo.sweep.jobs import Job


class SweepProgress:
    """A bar over the sweep's jobs; failures are printed above it with their log file as they happen."""

    def __init__(self, total: int, done: int, desc: str, enabled: bool = True) -> None:
        self.running, self.failed = 0, 0
        self.bar = tqdm(
            total=total, initial=done, desc=desc, unit="run", disable=not enabled, dynamic_ncols=True, file=sys.stderr
        )
        self._postfix()

    def _postfix(self) -> None:
        self.bar.set_postfix_str(f"running {self.running}, failed {self.failed}")

    def started(self, job: Job) -> None:
        self.running += 1
        self._postfix()

    def ended(self, job: Job, code: int) -> None:
        self.running -= 1
        if code != 0:
            self.failed += 1
            tqdm.write(f"failed: {job.name} (exit {code}); log: {job.log}", file=sys.stderr)
        self.bar.update(1)
        self._postfix()

    def close(self) -> None:
        self.bar.close()
