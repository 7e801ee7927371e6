"""A checkpoint's digests: ``digests.json`` written last, each file verified against it, or checked for structure.

The last file of every checkpoint is ``digests.json`` (:data:`MANIFEST`): the sha256 and size of every other file
it holds, written by rank 0 once every rank has written its part (:func:`write_manifest`). :func:`verify_checkpoint`
reports a damaged or incomplete checkpoint file by file: a file truncated, changed, missing or unreadable, or
``digests.json`` itself damaged. A checkpoint written before digests were recorded (no ``digests.json``) cannot be
verified: :func:`structure_problems` checks what its files' own structure shows (JSON that parses, safetensors files
whose header is whole and covers the file exactly: :func:`rlzoo.util.safetensors_header.read_header`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo.runtime.checkpoint.files import one_line
from rlzoo.util.atomic import atomic_write_text
from rlzoo.util.safetensors_header import HeaderProblem, read_header

#: the digests of a checkpoint's files, written last: ``{"format": ..., "files": {relative path: {sha256, size}}}``
MANIFEST = "digests.json"
MANIFEST_FORMAT = "rlzoo-checkpoint-digests-1"


def file_digest(path: Path) -> str:
    """The sha256 of a file's content, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path) -> None:
    """``directory/digests.json``, atomically: the sha256 and size of every other file under ``directory``."""
    directory = Path(directory)
    files = {}
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory).as_posix()
        if path.is_file() and relative != MANIFEST:
            files[relative] = {"sha256": file_digest(path), "size": path.stat().st_size}
    manifest = {"format": MANIFEST_FORMAT, "files": files, "files_sha256": _listing_digest(files)}
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=1))


def _listing_digest(files: Mapping[str, Any]) -> str:
    """The digest of the digests: a damaged ``digests.json`` that still parses is told from a damaged file."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


@dataclass
class CheckpointCheck:
    """What :func:`verify_checkpoint` found: one line per damaged file (empty: intact), and whether the files were
    checked against their digests (``False``: a checkpoint without ``digests.json``, checked for structure only)."""

    path: Path
    problems: list[str] = field(default_factory=list)
    verified: bool = True

    @property
    def intact(self) -> bool:
        return not self.problems


def verify_checkpoint(checkpoint: Path, within: str | None = None) -> CheckpointCheck:
    """Check every file of ``checkpoint`` against ``digests.json``: missing, truncated (or grown), content that
    differs from its digest, unreadable, or not written with the checkpoint. Without ``digests.json`` (written
    before digests were recorded): :func:`structure_problems` only, ``verified`` False. ``within`` (a sub-folder,
    e.g. ``"model"``): only the files under it, for a command that reads nothing else (``rlzoo export``);
    ``digests.json`` itself is checked whole either way."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        return CheckpointCheck(checkpoint, ["the folder is missing"])
    manifest = checkpoint / MANIFEST
    if not manifest.exists():
        if within is None:
            return CheckpointCheck(checkpoint, structure_problems(checkpoint, required=True), verified=False)
        problems = [f"{within}/{problem}" for problem in structure_problems(checkpoint / within)]
        return CheckpointCheck(checkpoint, problems, verified=False)
    try:
        data = json.loads(manifest.read_bytes())
        files = data["files"]
        if (
            data.get("format") != MANIFEST_FORMAT
            or data.get("files_sha256") != _listing_digest(files)
            or not all(
                isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int)
                for e in files.values()
            )
        ):
            raise ValueError("not a list of digests")
    except OSError as err:
        return CheckpointCheck(checkpoint, [f"{MANIFEST}: unreadable ({one_line(err)})"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return CheckpointCheck(checkpoint, [f"{MANIFEST}: damaged (not the file of digests that was written)"])
    problems = [] if "state.json" in files or within is not None else ["state.json: missing (not in digests.json)"]
    for relative, entry in sorted(files.items()):
        if within is not None and not relative.startswith(f"{within}/"):
            continue
        problem = _file_problem(checkpoint / relative, entry["size"], entry["sha256"])
        if problem:
            problems.append(f"{relative}: {problem}")
    for path in sorted((checkpoint / within if within is not None else checkpoint).rglob("*")):
        relative = path.relative_to(checkpoint).as_posix()
        if path.is_file() and relative != MANIFEST and relative not in files:
            problems.append(f"{relative}: not written with the checkpoint (not in {MANIFEST})")
    return CheckpointCheck(checkpoint, problems)


def _file_problem(path: Path, size: int, sha256: str) -> str | None:
    if not path.is_file():
        return "missing"
    try:
        actual = path.stat().st_size
        if actual < size:
            return f"truncated ({actual} of {size} bytes)"
        if actual > size:
            return f"longer than written ({actual} bytes, {size} written)"
        if file_digest(path) != sha256:
            return "content differs from its recorded sha256 digest"
    except OSError as err:
        return f"unreadable ({one_line(err)})"
    return None


def structure_problems(directory: Path, required: bool = False) -> list[str]:
    """What the files under ``directory`` show of themselves, without digests: JSON files that do not parse,
    safetensors files whose header does not parse or that are shorter or longer than it says, files that cannot
    be read; with ``required``, a checkpoint's own files that are missing (``state.json``, ``rng.*``, ``model/``)."""
    directory = Path(directory)
    problems = []
    if required:
        for name in ("state.json", "rng.json", "rng.safetensors"):
            if not (directory / name).is_file():
                problems.append(f"{name}: missing")
        if not (directory / "model").is_dir():
            problems.append("model/: missing")
    for path in sorted(directory.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(directory).as_posix()
        try:
            if path.suffix == ".json":
                json.loads(path.read_bytes())
            elif path.suffix == ".safetensors":
                read_header(path)
        except HeaderProblem as problem:
            problems.append(f"{relative}: {problem}")
        except OSError as err:
            problems.append(f"{relative}: unreadable ({one_line(err)})")
        except ValueError:
            problems.append(f"{relative}: damaged (not valid JSON)")
    return problems
