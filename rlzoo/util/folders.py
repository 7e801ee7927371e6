"""Whether a command can write a folder (made if missing), checked before it does any work: one line saying why not.

Used by the run's preflight (``output_dir``, ``cold_start.output_dir``) and by ``rlzoo model import`` (its target,
checked before a model is loaded). Permissions by :func:`os.access`, so root passes them (a read-only file system
still fails).
"""

from __future__ import annotations

import os
from pathlib import Path


def exists(path: Path) -> bool | None:
    """Whether ``path`` exists; ``None`` when a folder on the way cannot be searched (no x permission)."""
    try:
        return path.exists()
    except OSError:
        return None


def folder_problem(folder: Path, field: str) -> str | None:
    """Why a command cannot write into ``folder`` (made if missing), or ``None``: it is a file, or a folder this user
    cannot write to, or it is missing and cannot be made (an ancestor is a file, or the nearest existing one is not
    writable). ``field`` is what the user sets to choose another (``output_dir``)."""
    folder = Path(folder)
    if exists(folder):
        if not folder.is_dir():
            return f"{folder} is a file, not a folder: choose another {field}, or move the file away"
        if not os.access(folder, os.W_OK | os.X_OK):
            return (
                f"{folder} is a folder this user cannot write to: make it writable (chmod u+rwx {folder}) or "
                f"choose another {field}"
            )
        return None
    ancestor = folder.absolute().parent
    while not exists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{folder} cannot be made: {ancestor} is a file, not a folder; choose another {field}"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return (
            f"{folder} cannot be made: its parent folder {ancestor} is not writable by this user; choose another "
            f"{field}, or make the folder yourself with write permission"
        )
    return None
