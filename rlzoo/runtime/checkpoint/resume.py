"""Choosing the checkpoint a resumed run starts from: the newest intact one, verified, past any damaged newer one.

Resuming (:func:`resume_checkpoint`) verifies the checkpoint ``latest`` names
(:func:`rlzoo.runtime.checkpoint.digests.verify_checkpoint`) before anything is loaded from it; a damaged or
incomplete one is reported file by file and the run resumes from the newest intact earlier checkpoint
(``train.keep_checkpoints`` >= 2 keeps one), saying which one and which steps run again; with none intact it refuses
with :class:`CheckpointDamaged`, listing each checkpoint's problems. A checkpoint written before digests were
recorded (no ``digests.json``) is checked for structure only and chosen with a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlzoo.errors import RlzooError
from rlzoo.runtime.checkpoint.digests import MANIFEST, CheckpointCheck, verify_checkpoint
from rlzoo.runtime.checkpoint.files import checkpoint_candidates, step_of
from rlzoo.runtime.distributed import SINGLE, Dist

log = logging.getLogger(__name__)


class CheckpointDamaged(RlzooError):
    """``--resume`` found no intact checkpoint: every one is damaged or incomplete (each listed with its files)."""


def choose_checkpoint(run_dir: Path) -> Path:
    """The checkpoint a resumed run starts from: the newest intact of :func:`checkpoint_candidates`, verified
    (:func:`verify_checkpoint`). Warns (log) which damaged ones were passed over, file by file, and which steps run
    again, or that the one chosen cannot be verified; raises :class:`CheckpointDamaged` when none is intact."""
    root = Path(run_dir) / "checkpoints"
    candidates = checkpoint_candidates(run_dir)
    if not candidates:
        raise CheckpointDamaged(f"no complete checkpoint found in {root}; start a new run without --resume")
    damaged: list[CheckpointCheck] = []
    for candidate in candidates:
        check = verify_checkpoint(candidate)
        if check.intact:
            break
        damaged.append(check)
    else:
        listing = "\n".join(f"  {c.path.name}: {problem}" for c in damaged for problem in c.problems)
        raise CheckpointDamaged(
            f"no intact checkpoint to resume in {root}; every one is damaged or incomplete:\n{listing}\n"
            "restore the files from a copy, or start a new run without --resume"
        )
    chosen = check.path
    if damaged:
        first, last = step_of(chosen), step_of(damaged[0].path) - 1
        again = f"step {first} is" if first == last else f"steps {first}-{last} are"
        passed = "; ".join(f"checkpoint {c.path} is damaged ({', '.join(c.problems)})" for c in damaged)
        log.warning("%s: resuming from %s, the newest intact checkpoint, so %s run again", passed, chosen, again)
    if not check.verified:
        log.warning(
            "checkpoint %s has no %s (written by an earlier rlzoo): its files cannot be verified against digests, "
            "only checked for truncation; resuming from it as it is",
            chosen,
            MANIFEST,
        )
    return chosen


def resume_checkpoint(run_dir: Path, dist: Dist = SINGLE) -> Path:
    """:func:`choose_checkpoint` on rank 0, the same answer (or error) on every rank (a collective)."""
    if dist.is_main:
        try:
            answer = (str(choose_checkpoint(run_dir)), None)
        except RlzooError as err:
            answer = (None, str(err))
    else:
        answer = None
    path, error = dist.broadcast(answer)
    if error is not None:
        raise CheckpointDamaged(error)
    return Path(path)
