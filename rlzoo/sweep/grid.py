"""The sweep's grid: ``--vary`` values x seeds, one run folder per (cell, seed), validated before anything runs.

Folders::

    OUT/sweep.json                 the manifest: config file, base config hash, --set, --vary grid, seeds, plugins
    OUT/cold_start/<fingerprint>/  cold-start models, one per distinct cold start (shared by the cells, per seed)
    OUT/<cell>/seed<S>/            a normal run folder (config.yaml, metrics.jsonl, checkpoints/, log.txt)

A cell is named after its values (``preset-gspo_lr-0.0001``). Seeds are ``config.seed + i`` for ``i < --seeds``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlzoo.config.loading import dump_config, parse_override, read_yaml
from rlzoo.config.resolution import build_config
from rlzoo.config.schema import RunConfig, TrackingConfig
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.local_plugins import digests
from rlzoo.registry import Registry
from rlzoo.runtime import runlock

MANIFEST = "sweep.json"
COLD_STARTS = "cold_start"


@dataclass(frozen=True)
class Vary:
    """One ``--vary KEY=V1,V2``: a dotted config key and the raw (YAML) texts of its values."""

    key: str
    values: tuple[str, ...]


@dataclass
class Run:
    """One run of the grid: its cell, seed, folder and resolved config."""

    cell: str
    values: dict[str, Any]
    seed: int
    run_dir: Path
    config: RunConfig


def parse_vary(text: str) -> Vary:
    """``KEY=V1,V2`` -> :class:`Vary`; commas inside ``{...}`` / ``[...]`` belong to the value (``{name: hf}``)."""
    if "=" not in text:
        raise RlzooError(f"--vary {text!r} is not of the form dotted.key=V1,V2")
    key, raw = text.split("=", 1)
    parse_override(f"{key}=x")  # the same key rules as --set
    if key == "seed":
        raise RlzooError("--vary seed: seeds are set by --seeds N (seed, seed+1, ...), not varied as a value")
    values, depth, current = [], 0, ""
    for char in raw:
        depth += char in "[{"
        depth -= char in "]}"
        if char == "," and depth == 0:
            values.append(current.strip())
            current = ""
        else:
            current += char
    values.append(current.strip())
    if any(v == "" for v in values):
        raise RlzooError(f"--vary {text!r} has an empty value; write KEY=V1,V2,...")
    if len(set(values)) != len(values):
        raise RlzooError(f"--vary {text!r} names a value twice")
    return Vary(key, tuple(values))


def cell_name(values: dict[str, str], keys_seen: list[str]) -> str:
    """A folder name from a cell's values: ``<last key part>-<value>`` joined by ``_``, unsafe characters as ``-``."""

    def short(key: str) -> str:
        last = key.split(".")[-1]
        # the last part alone when no other --vary key ends the same way
        return last if sum(k.split(".")[-1] == last for k in keys_seen) == 1 else key

    parts = [f"{short(k)}-{v}" for k, v in values.items()]
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", "_".join(parts)).strip("-") or "base"


def base_hash(base: dict[str, Any], sets: list[str]) -> str:
    """Identity of the sweep's base config: the YAML file's data and the --set overrides, before any --vary."""
    text = json.dumps({"config": base, "set": sets}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Sweep:
    """The whole grid and its manifest."""

    out: Path
    manifest: dict[str, Any]
    runs: list[Run]

    @property
    def cells(self) -> list[str]:
        return list(dict.fromkeys(r.cell for r in self.runs))


def sweep_tracking(tracking: TrackingConfig, out: Path, cell: str, seed: int, values: dict[str, str]) -> TrackingConfig:
    """A sweep run as experiment trackers show it: grouped by the sweep, tagged with its cell, seed and varied
    values, its trackers' local store shared in the sweep folder; the user's own ``tracking`` settings win."""
    sweep = out.resolve().name
    return tracking.model_copy(
        update={
            "name": f"{tracking.name or sweep}/{cell}/seed{seed}",
            "group": tracking.group or sweep,
            "tags": {"sweep": sweep, "cell": cell, "seed": str(seed), **values, **tracking.tags},
            "store_dir": tracking.store_dir or str(out),
        }
    )


def build_sweep(
    config_file: str,
    varies: list[Vary],
    seeds: int,
    out: Path,
    sets: list[str],
    registry: Registry,
    plugins: Sequence[str] = (),
) -> Sweep:
    """Every cell's config built and validated (``ConfigError`` naming the cell and the field at second 0).
    ``plugins`` (``--plugin``) join each cell's config, so its run's ``config.yaml`` loads them in the job."""
    from rlzoo.runtime.cold_start import cold_start_fingerprint

    base = read_yaml(config_file)
    keys = [v.key for v in varies]
    if len(set(keys)) != len(keys):
        raise RlzooError(f"--vary names a key twice: {', '.join(keys)}; give each key once with all its values")
    base_config = build_config(base, sets, registry, source=config_file, plugins=plugins)
    runs: list[Run] = []
    problems: list[tuple[str, str]] = []
    for combo in itertools.product(*(v.values for v in varies)) if varies else [()]:
        values = dict(zip(keys, combo, strict=True))
        cell = cell_name(values, keys)
        overrides = [*sets, *(f"{k}={v}" for k, v in values.items())]
        for i in range(seeds):
            seed = base_config.seed + i
            run_dir = out / cell / f"seed{seed}"
            try:
                config = build_config(
                    base,
                    [*overrides, f"seed={seed}", f"output_dir={run_dir}"],
                    registry,
                    plugins=plugins,
                    folder=Path(config_file).parent,
                )
            except ConfigError as err:
                problems.extend((f"cell {cell}: {loc}", msg) for loc, msg in err.problems)
                break  # the other seeds of this cell fail the same way
            if config.model.path is None and config.cold_start.enabled:
                # one cold start per distinct setting, shared by every cell with it (a paired comparison)
                shared = out / COLD_STARTS / cold_start_fingerprint(config)
                config = config.model_copy(
                    update={"cold_start": config.cold_start.model_copy(update={"output_dir": str(shared)})}
                )
            config = config.model_copy(update={"tracking": sweep_tracking(config.tracking, out, cell, seed, values)})
            runs.append(Run(cell, {k: yaml.safe_load(v) for k, v in values.items()}, seed, run_dir, config))
    if problems:
        raise ConfigError(problems, source=config_file)
    if len({r.cell for r in runs}) != len(runs) // seeds:
        raise RlzooError("two --vary cells map to the same folder name; use values that differ in letters or digits")
    manifest = {
        "config": str(config_file),
        "base_config_hash": base_hash(base, sets),
        "set": sets,
        "vary": {v.key: list(v.values) for v in varies},
        "seeds": seeds,
        "plugins": digests(base_config.plugins),
        "cells": {cell: {k: str(v) for k, v in r.values.items()} for cell, r in {r.cell: r for r in runs}.items()},
    }
    return Sweep(out, manifest, runs)


def check_folder(sweep: Sweep) -> None:
    """``--out`` is new, empty, or holds this same sweep (to resume); anything else is refused, untouched."""
    path = sweep.out / MANIFEST
    if path.is_file():
        old = json.loads(path.read_text())
        identity = ("base_config_hash", "set", "vary", "seeds", "plugins")  # plugins: their files' digests
        differ = [key for key in identity if old.get(key, {} if key == "plugins" else None) != sweep.manifest[key]]
        if differ:
            raise RlzooError(
                f"{sweep.out} holds a different sweep (its {', '.join(differ)} differ{'s' if len(differ) == 1 else ''}"
                f" from this command's; see {path}); choose another --out, or rerun the original command to resume it"
            )
        return
    if sweep.out.exists() and not sweep.out.is_dir():
        raise RlzooError(f"--out {sweep.out} is a file; name a folder")
    # a sweep's lock file alone (a sweep stopped before its manifest was written) does not make the folder taken
    if sweep.out.exists() and any(p.name != runlock.LOCK_NAME for p in sweep.out.iterdir()):
        raise RlzooError(f"{sweep.out} is not empty and holds no {MANIFEST}: choose an empty or new --out folder")


def write_manifest(sweep: Sweep) -> None:
    sweep.out.mkdir(parents=True, exist_ok=True)
    path = sweep.out / MANIFEST
    if not path.is_file():
        path.write_text(json.dumps(sweep.manifest, indent=2) + "\n")


def write_config(run: Run) -> Path:
    """The run's resolved config at ``run_dir/config.yaml`` (what ``rlzoo train`` is started with)."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    path = run.run_dir / "config.yaml"
    path.write_text(dump_config(run.config))
    return path
