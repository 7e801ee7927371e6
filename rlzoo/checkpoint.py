"""Crash-safe checkpoint files: atomic writes, and optimizer / RNG state without pickle.

Everything is written into a temporary sibling and renamed into place, so a checkpoint either exists whole or
not at all (also with several processes: see :func:`atomic_directory`). Tensors go to safetensors, everything
else to JSON: loading never unpickles data.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rlzoo.distributed import SINGLE, Dist


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
    except BaseException:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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
    meta = json.loads((directory / "optimizer.json").read_text())
    tensors = load_file(str(directory / "optimizer.safetensors"))
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    for index, entries in meta["scalars"].items():
        state.setdefault(int(index), {}).update(entries)
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch": torch.get_rng_state()}
    version, internal, gauss = random.getstate()
    return tensors, {"python": [version, list(internal), gauss]}


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The run folder's newest complete checkpoint (``checkpoints/latest`` names it), or ``None``."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None
