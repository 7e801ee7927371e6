"""Compare the ``metrics.jsonl`` of two fixed-seed runs (or two folders of runs) value by value, the wall-clock and
memory metrics aside: the proof a refactor gives (docs/contributing.md, "Habits").

    python scripts/compare_metrics.py RUNS_BEFORE RUNS_AFTER

Every ``metrics.jsonl`` under ``RUNS_BEFORE`` is compared with the file at the same relative path under
``RUNS_AFTER``: the same rows, the same keys in the same order, the same values bit for bit (compared as written;
``time/*`` and ``memory/*`` keys ignored).
Exit 0 when every pair is identical, 1 otherwise (the first differences printed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

IGNORED = ("time/", "memory/")


def rows(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.append({key: value for key, value in row.items() if not key.startswith(IGNORED)})
    return out


def differences(before: Path, after: Path) -> list[str]:
    a, b = rows(before), rows(after)
    found = [f"rows: {len(a)} before, {len(b)} after"] if len(a) != len(b) else []
    for index, (x, y) in enumerate(zip(a, b)):
        # as written: a float's shortest repr is its bits (NaN equals NaN here, -0.0 differs from 0.0)
        found += [
            f"row {index} {key}: {x.get(key)!r} -> {y.get(key)!r}"
            for key in sorted(set(x) | set(y))
            if json.dumps(x.get(key)) != json.dumps(y.get(key))
        ]
        if not found and list(x) != list(y):
            found.append(f"row {index}: the same keys in another order")
    return found


def main(argv: list[str]) -> int:
    before_root, after_root = Path(argv[0]), Path(argv[1])
    failed = 0
    for before in sorted(before_root.rglob("metrics.jsonl")):
        after = after_root / before.relative_to(before_root)
        found = differences(before, after) if after.exists() else [f"{after} is missing"]
        values = sum(len(row) for row in rows(before))
        print(f"{'IDENTICAL' if not found else 'DIFFERENT'} {before.relative_to(before_root)} ({values} values)")
        for line in found[:10]:
            print(f"    {line}")
        failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
