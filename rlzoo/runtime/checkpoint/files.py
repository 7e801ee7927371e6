"""Crash-safe checkpoint files: atomic writes, and optimizer / RNG state without pickle.

Everything is written into a temporary sibling and renamed into place, so a checkpoint either exists whole or
not at all (also with several processes: see :func:`atomic_directory`). Tensors go to safetensors, everything
else to JSON: loading never unpickles data.

A run killed at any moment (SIGKILL included) leaves its newest complete checkpoint and ``checkpoints/latest``
pointing at it, plus at most a hidden ``.step_N.tmp-*`` folder that resuming ignores and the next save removes.
A checkpoint that cannot be written (disk full, a file-size limit, ...) raises :class:`CheckpointError`, one line
naming the checkpoint and the cause, and leaves the previous checkpoint and ``latest`` as they were.

Verified checkpoints. The last file of every checkpoint is ``digests.json`` (:data:`MANIFEST`): the sha256 and size
of every other file it holds, written by rank 0 once every rank has written its part. Resuming
(:func:`resume_checkpoint`) verifies the checkpoint ``latest`` names before anything is loaded from it; a damaged or
incomplete one (a file truncated, changed, missing or unreadable, or ``digests.json`` itself damaged) is reported
file by file and the run resumes from the newest intact earlier checkpoint (``train.keep_checkpoints`` >= 2 keeps
one), saying which one and which steps run again; with none intact it refuses with :class:`CheckpointDamaged`,
listing each checkpoint's problems. A checkpoint written before digests were recorded (no ``digests.json``) cannot
be verified: it is checked for what its files' own structure shows (JSON that parses, safetensors files as long as
their header says) and loaded with a warning. A load that fails all the same raises :class:`CheckpointLoadError`
naming the checkpoint and the file, never a library's traceback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rlzoo.runtime.distributed import SINGLE, Dist
from rlzoo.errors import RlzooError
from rlzoo.util.atomic import atomic_write_text, fsync_directory

#: test hook: a file path. When set, rank 0 creates that file once a checkpoint is half written (engine state in
#: the temporary folder, no ``state.json`` yet) and waits while the file exists (at most 10 minutes), so a test
#: can kill a run in the middle of writing a checkpoint, or delete the file to let it go on.
PAUSE_ENV = "RLZOO_TEST_CHECKPOINT_PAUSE"

#: the digests of a checkpoint's files, written last: ``{"format": ..., "files": {relative path: {sha256, size}}}``
MANIFEST = "digests.json"
MANIFEST_FORMAT = "rlzoo-checkpoint-digests-1"

log = logging.getLogger(__name__)


class CheckpointError(RlzooError):
    """A checkpoint could not be written; the previous one is intact."""


class CheckpointDamaged(RlzooError):
    """``--resume`` found no intact checkpoint: every one is damaged or incomplete (each listed with its files)."""


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
            f"state: {_one_line(err)}"
        ) from err


def read_json(path: Path) -> Any:
    """A checkpoint's JSON file; one that cannot be read or parsed is a :class:`CheckpointLoadError` naming it."""
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointLoadError(f"could not read {path}: {_one_line(err)}") from err


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file; one that cannot be read or parsed is a :class:`CheckpointLoadError`."""
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors' SafetensorError, an OSError, a header that is not JSON, ...
        raise CheckpointLoadError(f"could not read {path}: {_one_line(err)}") from err


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())  # one line, whatever the library wrote


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
            dist.barrier()  # every rank's part is written
            if dist.is_main:
                write_manifest(tmp)  # last: the digests of every file above
        if dist.is_main:
            atomic_write_text(root / "latest", final.name)
    except Exception as err:
        previous = latest_checkpoint(run_dir)
        kept = f"the previous checkpoint {previous} is intact" if previous is not None else "no earlier checkpoint exists"
        cause = " ".join(f"{type(err).__name__}: {err}".split())  # one line, whatever the library wrote
        raise CheckpointError(f"could not write checkpoint {final}: {cause}; {kept}") from err
    if dist.is_main:
        # newer ones are from before a resume that fell back past them (damaged, or superseded now): none is latest
        steps = sorted((p for p in root.glob("step_*") if _step_of(p) is not None), key=_step_of)
        newer = [p for p in steps if _step_of(p) > completed_steps]
        for old in [*newer, *[p for p in steps if _step_of(p) <= completed_steps][:-keep]]:
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
        raise CheckpointLoadError(f"rng.safetensors and rng.json hold no RNG state: {_one_line(err)}") from err


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
        raise CheckpointLoadError(f"could not load checkpoint {checkpoint}: {where}: {_one_line(err)}") from err


# -- verifying a checkpoint before resuming from it ----------------------------------------------------------------


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


def verify_checkpoint(checkpoint: Path) -> CheckpointCheck:
    """Check every file of ``checkpoint`` against ``digests.json``: missing, truncated (or grown), content that
    differs from its digest, unreadable, or not written with the checkpoint. Without ``digests.json`` (written
    before digests were recorded): :func:`structure_problems` only, ``verified`` False."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        return CheckpointCheck(checkpoint, ["the folder is missing"])
    manifest = checkpoint / MANIFEST
    if not manifest.exists():
        return CheckpointCheck(checkpoint, structure_problems(checkpoint, required=True), verified=False)
    try:
        data = json.loads(manifest.read_bytes())
        files = data["files"]
        if data.get("format") != MANIFEST_FORMAT or data.get("files_sha256") != _listing_digest(files) or not all(
            isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int)
            for e in files.values()
        ):
            raise ValueError("not a list of digests")
    except OSError as err:
        return CheckpointCheck(checkpoint, [f"{MANIFEST}: unreadable ({_one_line(err)})"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return CheckpointCheck(checkpoint, [f"{MANIFEST}: damaged (not the file of digests that was written)"])
    problems = [] if "state.json" in files else ["state.json: missing (not in digests.json)"]
    for relative, entry in sorted(files.items()):
        problem = _file_problem(checkpoint / relative, entry["size"], entry["sha256"])
        if problem:
            problems.append(f"{relative}: {problem}")
    for path in sorted(checkpoint.rglob("*")):
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
        return f"unreadable ({_one_line(err)})"
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
                problem = _safetensors_problem(path)
                if problem:
                    problems.append(f"{relative}: {problem}")
        except OSError as err:
            problems.append(f"{relative}: unreadable ({_one_line(err)})")
        except ValueError:
            problems.append(f"{relative}: damaged (not valid JSON)")
    return problems


def _safetensors_problem(path: Path) -> str | None:
    """Whether a safetensors file is as long as its header says (a truncated or overwritten header shows too)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"truncated ({size} bytes, not even a header)"
        length = struct.unpack("<Q", head)[0]
        if length > size - 8:
            return f"truncated or damaged header ({size} bytes, header of {length} bytes)"
        try:
            header = json.loads(handle.read(length))
            end = max((e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "damaged header (not valid safetensors)"
    expected = 8 + length + int(end)
    if size < expected:
        return f"truncated ({size} of {expected} bytes)"
    if size > expected:
        return f"longer than its header says ({size} bytes, {expected} expected)"
    return None


_STEP = re.compile(r"step_(\d+)")


def _step_of(path: Path) -> int | None:
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
    folders = [p for p in root.glob("step_*") if p.is_dir() and _step_of(p) is not None]
    folders.sort(key=_step_of, reverse=True)
    try:
        named = root / pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return folders
    newest = _step_of(named)
    if newest is None:
        return folders
    return [named, *(p for p in folders if _step_of(p) < newest)]


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
        first, last = _step_of(chosen), _step_of(damaged[0].path) - 1
        again = f"step {first} is" if first == last else f"steps {first}-{last} are"
        passed = "; ".join(f"checkpoint {c.path} is damaged ({', '.join(c.problems)})" for c in damaged)
        log.warning("%s: resuming from %s, the newest intact checkpoint, so %s run again", passed, chosen, again)
    if not check.verified:
        log.warning(
            "checkpoint %s has no %s (written by an earlier rlzoo): its files cannot be verified against digests, "
            "only checked for truncation; resuming from it as it is",
            chosen, MANIFEST,
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
