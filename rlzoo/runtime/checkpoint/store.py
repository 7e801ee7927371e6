"""Saving and loading a training step's checkpoint, and pruning the old ones.

A run's checkpoints live in ``RUN_DIR/checkpoints/step_N`` (written atomically by
:func:`rlzoo.runtime.checkpoint.files.atomic_directory`, ``digests.json`` last) with ``checkpoints/latest`` naming
the newest. A run killed at any moment (SIGKILL included) leaves its newest complete checkpoint and ``latest``
pointing at it, plus at most a hidden ``.step_N.tmp-*`` folder that resuming ignores and the next save removes.
A checkpoint that cannot be written (disk full, a file-size limit, ...) raises :class:`CheckpointError`, one line
naming the checkpoint and the cause, and leaves the previous checkpoint and ``latest`` as they were. A load that
fails raises :class:`rlzoo.runtime.checkpoint.files.CheckpointLoadError` naming the checkpoint and the file.

Documented test hook: with the environment variable ``RLZOO_TEST_CHECKPOINT_PAUSE`` (:data:`PAUSE_ENV`) set to a
file path, rank 0 pauses every save half way (see :data:`PAUSE_ENV`) so that a test can kill a run in the middle of
writing a checkpoint. Nothing else reads it; unset (always, outside the tests) a save never waits.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from rlzoo.errors import RlzooError
from rlzoo.runtime.checkpoint.digests import structure_problems, write_manifest
from rlzoo.runtime.checkpoint.files import (
    CheckpointLoadError,
    atomic_directory,
    latest_checkpoint,
    one_line,
    read_json,
    read_tensors,
    rng_state,
    set_rng_state,
    step_of,
)
from rlzoo.runtime.distributed import SINGLE, Dist
from rlzoo.util.atomic import atomic_write_text

#: test hook: a file path. When set, rank 0 creates that file once a checkpoint is half written (engine state in
#: the temporary folder, no ``state.json`` yet) and waits while the file exists (at most 10 minutes), so a test
#: can kill a run in the middle of writing a checkpoint, or delete the file to let it go on.
PAUSE_ENV = "RLZOO_TEST_CHECKPOINT_PAUSE"


class CheckpointError(RlzooError):
    """A checkpoint could not be written; the previous one is intact."""


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
            dist.barrier()  # every rank's part is written
            if dist.is_main:
                write_manifest(tmp)  # last: the digests of every file above
        if dist.is_main:
            atomic_write_text(root / "latest", final.name)
    except Exception as err:
        previous = latest_checkpoint(run_dir)
        kept = (
            f"the previous checkpoint {previous} is intact" if previous is not None else "no earlier checkpoint exists"
        )
        raise CheckpointError(f"could not write checkpoint {final}: {one_line(err)}; {kept}") from err
    if dist.is_main:
        _prune(root, completed_steps, keep)
    return final


def _prune(root: Path, completed_steps: int, keep: int) -> None:
    """Drop all but the ``keep`` newest checkpoints up to ``completed_steps``, every later one, and stale temporaries."""
    # newer ones are from before a resume that fell back past them (damaged, or superseded now): none is latest
    steps = sorted((p for p in root.glob("step_*") if step_of(p) is not None), key=step_of)
    newer = [p for p in steps if step_of(p) > completed_steps]
    for old in [*newer, *[p for p in steps if step_of(p) <= completed_steps][:-keep]]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in [*root.glob(".step_*.tmp-*"), *root.glob(".latest.tmp-*")]:  # left by a killed run
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def _pause_for_tests() -> None:
    """The documented test hook :data:`PAUSE_ENV`: hold rank 0 with the checkpoint half written."""
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
    the RNG; returns ``state.json`` (``completed_steps`` and the components' state saved with it). A file that does
    not load is a :class:`CheckpointLoadError` naming the checkpoint and, where its structure shows it, the file."""
    _load_part(checkpoint, trainer.load_state, checkpoint, "the training engine's state")
    for name, engine in (engines or {}).items():
        if not (checkpoint / name).is_dir():
            raise RlzooError(f"checkpoint {checkpoint} has no {name}/ folder: it was written by a run without a {name}")
        _load_part(checkpoint, engine.load_state, checkpoint / name, f"the {name}'s state")
    _load_part(checkpoint, _load_rng, checkpoint, "the RNG state")
    try:
        state = read_json(checkpoint / "state.json")
    except CheckpointLoadError as err:
        raise CheckpointLoadError(f"could not load checkpoint {checkpoint}: {err}") from err
    if not isinstance(state, dict) or not isinstance(state.get("completed_steps"), int):
        raise CheckpointLoadError(f"could not load checkpoint {checkpoint}: state.json holds no completed_steps")
    return state


def _load_rng(checkpoint: Path) -> None:
    tensors, meta = read_tensors(checkpoint / "rng.safetensors"), read_json(checkpoint / "rng.json")
    try:
        set_rng_state(tensors, meta)
    except (KeyError, ValueError, TypeError, RuntimeError) as err:
        raise CheckpointLoadError(f"rng.safetensors and rng.json hold no RNG state: {one_line(err)}") from err


def _load_part(checkpoint: Path, load: Callable[[Path], None], directory: Path, what: str) -> None:
    try:
        load(directory)
    except CheckpointLoadError as err:
        raise CheckpointLoadError(f"could not load checkpoint {checkpoint}: {err}") from err
    except RlzooError:
        raise
    except Exception as err:  # a library's error: name the file where the files' own structure shows which
        damaged = structure_problems(directory)
        where = "; ".join(damaged) if damaged else f"{what} in {directory}"
        raise CheckpointLoadError(f"could not load checkpoint {checkpoint}: {where}: {one_line(err)}") from err
