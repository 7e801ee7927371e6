"""What the loggers share: the config flattened to dotted keys, the tracker run's id kept across a resume."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: the file in a logger's own folder (``loggers/<name>/``) that keeps its tracker run's id across a resume
STATE = "run.json"


def plain(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as plain JSON data (nested dicts and lists; anything else as its text)."""
    return json.loads(json.dumps(dict(config), default=str))


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config as ``{dotted.key: value}``: a list's items by index (``loggers.0.name``, as rlzoo names
    config fields), an empty dict or list as ``{}`` / ``[]``, any other value unchanged."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        at = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{at}."))
        elif isinstance(value, (list, tuple)) and value:
            flat.update(flatten({str(i): v for i, v in enumerate(value)}, f"{at}."))
        else:
            flat[at] = {} if isinstance(value, Mapping) else [] if isinstance(value, (list, tuple)) else value
    return flat


def as_text(value: Any) -> str:
    """A config value as a tracker shows it: a string as itself, anything else as JSON (``null``, ``true``, ``0.5``)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def finite(value: Any) -> bool:
    """A real number that is neither NaN nor infinite (what a tracker that drops non-finite values keeps)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def read_state(state_dir: Path) -> dict[str, Any]:
    """What a logger kept in its folder (``run.json``), or ``{}``."""
    try:
        state = json.loads((Path(state_dir) / STATE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(state_dir: Path, state: Mapping[str, Any]) -> None:
    """Keep ``state`` in the logger's folder (written whole or not at all)."""
    path = Path(state_dir) / STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(state), indent=2) + "\n")
    os.replace(tmp, path)
