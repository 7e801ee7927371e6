"""Crash-safe checkpoint files: atomic folders, optimizer / RNG state without pickle, reading and listing checkpoints.

Everything is written into a temporary sibling and renamed into place, so a checkpoint either exists whole or
not at all (also with several processes: see :func:`atomic_directory`). Tensors go to safetensors, everything
else to JSON: loading never unpickles data. A file that cannot be read back raises :class:`CheckpointLoadError`
naming it, never a library's traceback.

The low-level part of :mod:`rlzoo.runtime.checkpoint` that the training engines (their optimizer state) and the
preflight (which checkpoints a run has) use; saving a step is :mod:`rlzoo.runtime.checkpoint.store`, its digests
:mod:`rlzoo.runtime.checkpoint.digests`, choosing where to resume :mod:`rlzoo.runtime.checkpoint.resume`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rlzoo.errors import RlzooError
from rlzoo.runtime.distributed import SINGLE, Dist
from rlzoo.util.atomic import fsync_directory


class CheckpointLoadError(RlzooError):
    """A checkpoint could not be loaded (a file that does not parse, a missing key); names the checkpoint and file."""


@contextmanager
def atomic_directory(final: Path, dist: Dist = SINGLE) -> Iterator[Path]:
    """Yield a temporary directory that is renamed to ``final`` only if the block completes.

    With several processes (``dist``) every rank enters the block with the same directory, created by rank 0;
    rank 0 renames it once every rank has left the block (a barrier), so each rank can write its own files into it.
    """
    final = Path(final)
    tmp: Path | None = None
    if dist.is_main:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    tmp = Path(dist.broadcast(str(tmp) if tmp is not None else None))
    try:
        yield tmp
        dist.barrier()  # every rank has written its part
        if dist.is_main:
            for path in tmp.rglob("*"):
                if path.is_file():
                    with open(path, "rb") as handle:
                        os.fsync(handle.fileno())
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_directory(final.parent)  # the rename itself survives a power cut
    except BaseException:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(index), {})[key] = value
    save_file(tensors, str(directory / "optimizer.safetensors"))
    (directory / "optimizer.json").write_text(json.dumps({"param_groups": state["param_groups"], "scalars": scalars}))


def load_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    meta = read_json(directory / "optimizer.json")
    tensors = read_tensors(directory / "optimizer.safetensors")
    state: dict[int, dict[str, Any]] = {}
    try:
        for name, value in tensors.items():
            index, key = name.split(".", 1)
            state.setdefault(int(index), {})[key] = value
        for index, entries in meta["scalars"].items():
            state.setdefault(int(index), {}).update(entries)
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise CheckpointLoadError(
            f"{directory / 'optimizer.json'} and {directory / 'optimizer.safetensors'} do not hold this optimizer's "
            f"state: {one_line(err)}"
        ) from err


def read_json(path: Path) -> Any:
    """A checkpoint's JSON file; one that cannot be read or parsed is a :class:`CheckpointLoadError` naming it."""
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointLoadError(f"could not read {path}: {one_line(err)}") from err


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file; one that cannot be read or parsed is a :class:`CheckpointLoadError`."""
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors' SafetensorError, an OSError, a header that is not JSON, ...
        raise CheckpointLoadError(f"could not read {path}: {one_line(err)}") from err


def one_line(err: BaseException) -> str:
    """An error as one line, ``Type: message``, whatever the library wrote (the checkpoint errors quote it)."""
    return " ".join(f"{type(err).__name__}: {err}".split())


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch": torch.get_rng_state()}
    version, internal, gauss = random.getstate()
    return tensors, {"python": [version, list(internal), gauss]}


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))


# -- a run's checkpoints -----------------------------------------------------------------------------------------


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete ``checkpoints/step_N`` of a run folder (``None`` when there is none)."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


_STEP = re.compile(r"step_(\d+)")


def step_of(path: Path) -> int | None:
    """The step of a ``step_N`` checkpoint folder (``None`` for any other name)."""
    match = _STEP.fullmatch(path.name)
    return int(match.group(1)) if match else None


def checkpoint_candidates(run_dir: Path) -> list[Path]:
    """The checkpoints ``--resume`` may start from, newest first: the one ``checkpoints/latest`` names (whether or
    not it is complete) and the earlier ones; every ``step_N`` folder when ``latest`` names none; ``[]`` without
    ``latest`` (no checkpoint was ever completed). Cheap: reads names only (the preflight's check)."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.is_file():
        return []
    folders = [p for p in root.glob("step_*") if p.is_dir() and step_of(p) is not None]
    folders.sort(key=step_of, reverse=True)
    try:
        named = root / pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return folders
    newest = step_of(named)
    if newest is None:
        return folders
    return [named, *(p for p in folders if step_of(p) < newest)]
