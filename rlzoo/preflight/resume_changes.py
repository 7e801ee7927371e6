"""What a resume may change: a run's record stays true to every step it ran.

``config.yaml`` is the config a run started with and is never rewritten. A ``--resume`` compares the config it is
given with the run's *effective* config (``config.yaml`` with every change recorded since applied) field by field:

- fields in :data:`RESUMABLE` (how long to run, how often to evaluate and checkpoint, where to log) may change;
- any other difference changes the math or the shapes of what was trained so far, and the resume is refused,
  listing each field with its old and new value, unless ``--allow-changes FIELD...`` names it (a field, or a
  section such as ``trainer`` for all its fields);
- every change that goes ahead is appended to ``config_changes.jsonl``: the step it takes effect at, and each
  field's old and new value.

The code of the run's local plugins (``plugins:``, ``--plugin``) counts as config: ``plugins.json`` in the run folder
holds the sha256 of each plugin file as the run's latest start loaded it, compared as the field
``plugins.<entry>``, so ``--allow-changes plugins`` lets a changed file (or a changed list) go ahead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from rlzoo.config.resolution import iter_component_specs
from rlzoo.config.schema import RunConfig
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Problem, RunFacts
from rlzoo.local_plugins import digests
from rlzoo.util.atomic import atomic_write_text

if TYPE_CHECKING:
    from rlzoo.interfaces.run_facts import ComponentCatalogue

#: fields a resumed run may change without --allow-changes: they do not change what any step computes
RESUMABLE = (
    "output_dir",  # a resume runs in the folder it is given
    "train.steps",
    "train.eval_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "loggers",
    "tracking",
)
CHANGES_FILE = "config_changes.jsonl"
PLUGINS_FILE = "plugins.json"  # {plugin entry: "sha256:..."} of the files the run's latest start loaded

Changes = dict[str, tuple[Any, Any]]  # dotted field -> (old value, new value)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested config data as ``{dotted field: leaf value}``; lists are leaves (compared whole)."""
    if isinstance(data, Mapping) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def _covers(pattern: str, field: str) -> bool:
    return field == pattern or field.startswith(pattern + ".")


def effective_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's config as its latest steps ran: ``config.yaml`` with the recorded changes applied (flat), or None
    when the folder has no ``config.yaml``."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    fields = flatten(yaml.safe_load(path.read_text()) or {})
    changes = Path(run_dir) / CHANGES_FILE
    if changes.is_file():
        for line in changes.read_text().splitlines():
            if line.strip():
                for field, (_, new) in json.loads(line)["changes"].items():
                    fields = {k: v for k, v in fields.items() if not _covers(field, k)}
                    fields.update(flatten(new, field))
    # the plugin files' digests: as recorded at the latest start (the changes above hold their history)
    fields = {k: v for k, v in fields.items() if not k.startswith("plugins.")}
    return {**fields, **_digest_fields(_recorded_digests(run_dir))}


def _digest_fields(digests: Mapping[str, str]) -> dict[str, str]:
    return {f"plugins.{entry}": digest for entry, digest in digests.items()}


def _recorded_digests(run_dir: Path) -> dict[str, str]:
    path = Path(run_dir) / PLUGINS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def record_plugins(run_dir: Path, config: RunConfig) -> None:
    """Write ``plugins.json``: the digests of the run's plugin files as this process loaded them (at a run's start
    and at each resume, after :func:`record_changes`)."""
    path = Path(run_dir) / PLUGINS_FILE
    if config.plugins or path.is_file():
        atomic_write_text(path, json.dumps(digests(config.plugins), indent=2) + "\n")


def config_changes(run_dir: Path, config: RunConfig, registry: ComponentCatalogue | None = None) -> Changes:
    """Each field whose value in ``config`` differs from the run's effective config (``registry``: where the
    defaults of the components' parameters are found)."""
    old = effective_config(run_dir)
    if old is None:
        return {}
    new = {**flatten(config.model_dump(mode="json")), **_digest_fields(digests(config.plugins))}
    # a field the saved config lacks (added to rlzoo, or to a component, since the run started) is no change while
    # it keeps its default
    defaults = {**flatten(RunConfig().model_dump(mode="json")), **_parameter_defaults(config, registry)}
    return {
        field: (old.get(field), new.get(field))
        for field in sorted(set(old) | set(new))
        if old.get(field) != new.get(field) and not (field not in old and new.get(field) == defaults.get(field, ...))
    }


def _parameter_defaults(config: RunConfig, registry: ComponentCatalogue | None) -> dict[str, Any]:
    """``{dotted field: default}`` of every parameter of the config's components."""
    defaults: dict[str, Any] = {}
    for loc, spec in iter_component_specs(config) if registry is not None else ():
        try:
            params = registry.get(spec.kind, spec.name).cls.Params.model_validate({})
        except (RlzooError, ValidationError):
            continue  # a parameter without a default: it was given, so it is in the saved config too
        defaults.update(flatten(params.model_dump(mode="json"), loc))
    return defaults


def resume_change_rule(run: RunFacts) -> list[Problem]:
    """A resume (``--resume``) refuses every change of the run's config that neither :data:`RESUMABLE` nor
    ``--allow-changes`` allows."""
    if run.resume is None or not Path(run.resume).is_dir():
        return []
    return refusal_problems(refused(config_changes(Path(run.resume), run.config, run.registry), run.allow_changes))


def refused(changes: Changes, allowed: Sequence[str] = ()) -> Changes:
    """The changes neither :data:`RESUMABLE` nor named by ``--allow-changes``."""
    return {
        field: values
        for field, values in changes.items()
        if not any(_covers(pattern, field) for pattern in (*RESUMABLE, *allowed))
    }


def refusal_problems(changes: Changes) -> list[tuple[str, str]]:
    """One ``(field, message)`` per refused change, for :class:`rlzoo.errors.ConfigError`."""
    problems = []
    for field, (old, new) in changes.items():
        if not field.startswith("plugins."):
            problems.append(
                (
                    field,
                    f"changed since the run started: {_show(old)} -> {_show(new)}; a resume keeps the "
                    f"run's config. Restore it, start a new run, or pass --allow-changes {field} to continue "
                    f"with the change (recorded in {CHANGES_FILE})",
                )
            )
        elif old is not None and new is not None:  # a file added or dropped: the change of the plugins list says so
            problems.append(
                (
                    "plugins",
                    f"{field.removeprefix('plugins.')} changed since the run started (sha256 "
                    f"{_short(old)} -> {_short(new)}); a resume runs the code the run ran. Restore the file, "
                    "start a new run, or pass --allow-changes plugins to continue with the change (recorded "
                    f"in {CHANGES_FILE})",
                )
            )
    return problems


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12] + "..."


def _show(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value)


def _recorded(changes: Changes) -> Changes:
    return {field: values for field, values in changes.items() if field != "output_dir"}  # a resume's own folder


def describe(changes: Changes) -> str:
    """The changes a resume goes ahead with, on one line (empty when there are none)."""
    return "; ".join(f"{field} {_show(old)} -> {_show(new)}" for field, (old, new) in _recorded(changes).items())


def record_changes(run_dir: Path, step: int, changes: Changes) -> None:
    """Append the changes a resume goes ahead with (taking effect at ``step``) to ``config_changes.jsonl``."""
    changes = _recorded(changes)
    if not changes:
        return
    row = {
        "step": step,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "changes": {f: list(v) for f, v in changes.items()},
    }
    with open(Path(run_dir) / CHANGES_FILE, "a") as handle:
        handle.write(json.dumps(row) + "\n")
        handle.flush()
