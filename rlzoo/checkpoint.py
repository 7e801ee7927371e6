"""Crash-safe checkpoint files: atomic writes, and optimizer / RNG state without pickle.

Everything is written into a temporary sibling and renamed into place, so a checkpoint either exists whole or
not at all (also with several processes: see :func:`atomic_directory`). Tensors go to safetensors, everything
else to JSON: loading never unpickles data.

A run killed at any moment (SIGKILL included) leaves its newest complete checkpoint and ``checkpoints/latest``
pointing at it, plus at most a hidden ``.step_N.tmp-*`` folder that resuming ignores and the next save removes.
A checkpoint that cannot be written (disk full, a file-size limit, ...) raises :class:`CheckpointError`, one line
naming the checkpoint and the cause, and leaves the previous checkpoint and ``latest`` as they were.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rlzoo.distributed import SINGLE, Dist
from rlzoo.errors import RlzooError

#: test hook: a file path. When set, rank 0 creates that file once a checkpoint is half written (engine state in
#: the temporary folder, no ``state.json`` yet) and waits while the file exists (at most 10 minutes), so a test
#: can kill a run in the middle of writing a checkpoint, or delete the file to let it go on.
PAUSE_ENV = "RLZOO_TEST_CHECKPOINT_PAUSE"


class CheckpointError(RlzooError):
    """A checkpoint could not be written; the previous one is intact."""


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
            _fsync_directory(final.parent)  # the rename itself survives a power cut
    except BaseException:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


# -- a run's checkpoints -----------------------------------------------------------------------------------------


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete ``checkpoints/step_N`` of a run folder (``None`` when there is none)."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def save_checkpoint(
    run_dir: Path,
    completed_steps: int,
    trainer: Any,
    tokenizer: Any,
    keep: int,
    dist: Dist = SINGLE,
    engines: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``checkpoints/step_N`` atomically, then point ``latest`` at it and drop all but the ``keep`` newest.

    A collective with several processes (every rank calls it): each rank writes its own engine state
    (``trainer.save``, and each of ``engines`` into its own sub-folder, e.g. ``critic/``), rank 0 the tokenizer,
    the RNG state and ``state.json`` (``completed_steps`` and ``state``: the components' JSON state). Raises :class:`CheckpointError`
    if this rank could not write its part (the other ranks then wait for it until the launcher or the process
    group's timeout ends them); the previous checkpoint and ``latest`` are left as they were."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{completed_steps:06d}"
    try:
        with atomic_directory(final, dist) as tmp:
            trainer.save(tmp)
            for name, engine in (engines or {}).items():
                (tmp / name).mkdir(exist_ok=True)
                engine.save(tmp / name)
            if dist.is_main:
                _pause_for_tests()
                tokenizer.save_pretrained(tmp / "model")
                tensors, meta = rng_state()
                save_file(tensors, str(tmp / "rng.safetensors"))
                (tmp / "rng.json").write_text(json.dumps(meta))
                (tmp / "state.json").write_text(json.dumps({**(state or {}), "completed_steps": completed_steps}))
        if dist.is_main:
            atomic_write_text(root / "latest", final.name)
    except Exception as err:
        previous = latest_checkpoint(run_dir)
        kept = f"the previous checkpoint {previous} is intact" if previous is not None else "no earlier checkpoint exists"
        cause = " ".join(f"{type(err).__name__}: {err}".split())  # one line, whatever the library wrote
        raise CheckpointError(f"could not write checkpoint {final}: {cause}; {kept}") from err
    if dist.is_main:
        for old in sorted(root.glob("step_*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in [*root.glob(".step_*.tmp-*"), *root.glob(".latest.tmp-*")]:  # left by a killed run
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
    return final


def _pause_for_tests() -> None:
    marker = os.environ.get(PAUSE_ENV)
    if not marker:
        return
    marker_path = Path(marker)
    marker_path.write_text("half written\n")
    deadline = time.monotonic() + 600
    while marker_path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def load_checkpoint(checkpoint: Path, trainer: Any, engines: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Restore the engines' state (a collective: every rank loads its own; ``engines`` from their sub-folders) and
    the RNG; returns ``state.json`` (``completed_steps`` and the components' state saved with it)."""
    trainer.load_state(checkpoint)
    for name, engine in (engines or {}).items():
        if not (checkpoint / name).is_dir():
            raise RlzooError(f"checkpoint {checkpoint} has no {name}/ folder: it was written by a run without a {name}")
        engine.load_state(checkpoint / name)
    set_rng_state(load_file(str(checkpoint / "rng.safetensors")), json.loads((checkpoint / "rng.json").read_text()))
    return json.loads((checkpoint / "state.json").read_text())
