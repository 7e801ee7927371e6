"""The on-disk cache of scored service replies: a resumed run asks no service twice for the same response.

SQLite (the standard library's ``sqlite3``) rather than a JSONL log: each write is one committed transaction, so a
run killed mid-write leaves the file readable (a torn last line of a log would need repairing); a lookup reads one
indexed row instead of loading the whole history into memory on every start; and the ranks of a multi-process run
may share the file (SQLite locks it; they wait up to ``BUSY_S`` seconds).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

BUSY_S = 30.0


def cache_key(*parts: Any) -> str:
    """A digest of ``parts`` (JSON-encoded; a value JSON cannot hold is written as its ``str``)."""
    text = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class ResponseCache:
    """``key -> JSON value`` in the SQLite file ``path`` (created with its folder)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # one connection, used from the scoring thread and a timed-out one
        self._db = sqlite3.connect(self.path, timeout=BUSY_S, check_same_thread=False)
        with self._lock, self._db:
            self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        """The cached values of those of ``keys`` that are cached."""
        found: dict[str, Any] = {}
        with self._lock:
            for start in range(0, len(keys), 500):  # under SQLite's limit of bound parameters
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for key, value in self._db.execute(f"SELECT key, value FROM replies WHERE key IN ({marks})", chunk):
                    found[key] = json.loads(value)
        return found

    def put_many(self, items: dict[str, Any]) -> None:
        """Store ``items`` in one transaction."""
        if not items:
            return
        rows = [(key, json.dumps(value)) for key, value in items.items()]
        with self._lock, self._db:
            self._db.executemany("INSERT OR REPLACE INTO replies (key, value) VALUES (?, ?)", rows)

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
