"""Components from a script: ``plugins: [./my_loss.py, my_pkg.my_module]`` in a run config, ``--plugin PATH``.

A local plugin is a Python file, or a module importable by its dotted name, loaded into a registry as an entry
point's module is (:meth:`rlzoo.registry.Registry.register_plugin`): its module-level ``@rlzoo.hookimpl`` functions
and the classes it marks with ``@rlzoo.register(kind, name)`` contribute components, with the same checks. Its
origin, as ``plugins list`` and a clash of names show it, is ``script my_loss.py`` (``module my_pkg.my_module``).

What differs from an installed plugin is that the user asked for this one: whatever keeps it from contributing is an
error naming the field (``plugins.<i>`` or ``--plugin``) rather than a warning, and never a traceback:

- a path that does not exist, or a module that cannot be found;
- a file that fails to import: its file and line (the innermost line of that file in the traceback);
- a hook that breaks the contract (returns a non-component, a class of the wrong kind);
- a module that registers nothing.

A file is imported as the module named after it (``my_loss``), its folder appended to ``sys.path`` as Python does
for a script: it may import modules beside it, and a process it starts with ``multiprocessing`` (spawn) finds it by
name when it unpickles one of its functions or classes. A name already taken by another module is refused.

Each file's sha256 is kept (:func:`digests`) as the process loaded it: the run folder records them
(:mod:`rlzoo.preflight.resume_changes`), so a resume refuses a changed file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlzoo.errors import ConfigError, RlzooError
from rlzoo.registry import Registry, forget_marks

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
NO_COMPONENT = (
    "registers no component: give it module-level @rlzoo.hookimpl functions (rlzoo_clippers, ...) or mark a "
    'component class with @rlzoo.register("clipper", "my-clip")'
)


@dataclass(frozen=True)
class LocalPlugin:
    """A loaded local plugin: ``entry`` as the run's config records it (an absolute file path, or a module name)."""

    entry: str
    module: types.ModuleType
    source: Path | None  # the file the module ran (None: a module without a source file)
    digest: str | None  # "sha256:<hex>" of that file as it was run

    @property
    def origin(self) -> str:
        """How ``plugins list`` and a clash of names show where its components come from."""
        return f"script {Path(self.entry).name}" if is_file_entry(self.entry) else f"module {self.entry}"


_LOADED: dict[str, LocalPlugin] = {}  # entry -> plugin, for this process


def is_file_entry(entry: str) -> bool:
    """A path (``my_loss.py``, ``./lib/my_loss``) rather than a dotted module name (``my_pkg.my_module``)."""
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def resolve_entry(entry: str, folder: Path) -> str:
    """A file entry as an absolute path (relative ones against ``folder``); a module name as it is."""
    return str((folder / Path(entry).expanduser()).resolve()) if is_file_entry(entry) else entry


def file_digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def digests(entries: Sequence[str]) -> dict[str, str]:
    """``{entry: "sha256:..."}`` of the resolved entries' source files: as this process loaded them, else as the
    files are now (a file that is gone is left out: the resume's preflight names what it cannot load)."""
    out = {}
    for entry in entries:
        loaded = _LOADED.get(entry)
        if loaded is not None:
            if loaded.digest is not None:
                out[entry] = loaded.digest
        elif is_file_entry(entry) and Path(entry).is_file():
            out[entry] = file_digest(Path(entry))
    return out


def load_plugins(entries: Sequence[str], registry: Registry, field: str, folder: Path) -> list[str]:
    """Load each entry into ``registry`` (once: an entry loaded before is skipped); returns the resolved entries.
    ``field`` names them in errors: ``plugins`` (then ``plugins.<i>``) or ``--plugin``."""
    if isinstance(entries, str) or not isinstance(entries, Sequence):
        raise ConfigError([(field, f"{entries!r} is not a list; write [./my_loss.py, my_pkg.my_module]")])
    resolved = []
    for i, entry in enumerate(entries):
        loc = f"{field}.{i}" if field == "plugins" else field
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigError(
                [(loc, f"{entry!r} is not a Python file (./my_loss.py) or module name (my_pkg.my_module)")]
            )
        full = resolve_entry(entry.strip(), folder)
        if full not in resolved:
            _load(full, entry, registry, loc)
            resolved.append(full)
    return resolved


def _load(entry: str, written: str, registry: Registry, loc: str) -> None:
    plugin = _LOADED.get(entry) or _import(entry, written, loc)
    _LOADED[entry] = plugin
    if registry.has_plugin(plugin.module):
        return
    try:
        found = registry.register_plugin(plugin.module, name=entry, distribution=plugin.origin)
    except Exception as exc:  # a hook that raises or breaks the contract: named like an import failure
        raise ConfigError([(loc, _failure(written, plugin.source, exc))]) from None
    if not found:
        raise ConfigError([(loc, f"{written} {NO_COMPONENT}")])


def _import(entry: str, written: str, loc: str) -> LocalPlugin:
    if is_file_entry(entry):
        return _import_file(Path(entry), written, loc)
    if not _MODULE_NAME.fullmatch(entry):
        raise ConfigError(
            [(loc, f"{written!r} is neither a Python file (ending in .py) nor a module name (my_pkg.my_module)")]
        )
    try:
        spec = importlib.util.find_spec(entry)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ConfigError(
            [
                (
                    loc,
                    f"no module named {entry!r} (on PYTHONPATH or installed); a file is written "
                    "as a path ending in .py",
                )
            ]
        )
    source = Path(spec.origin) if spec.origin and Path(spec.origin).is_file() else None
    digest = file_digest(source) if source is not None else None
    try:
        module = importlib.import_module(entry)
    except Exception as exc:  # the module's own failure, named by file and line
        forget_marks(entry)
        raise ConfigError([(loc, _failure(written, source, exc))]) from None
    return LocalPlugin(entry, module, source, digest)


def _import_file(path: Path, written: str, loc: str) -> LocalPlugin:
    if not path.is_file():
        where = "is a folder, not a Python file" if path.is_dir() else "does not exist"
        raise ConfigError([(loc, f"{written} {where} ({path})")])
    name = path.stem
    if not name.isidentifier():
        raise ConfigError(
            [
                (
                    loc,
                    f"{written}: a plugin file is imported as a module named after it, so its name must "
                    f"be a Python name (letters, digits, _): rename it, e.g. {_identifier(name)}.py",
                )
            ]
        )
    taken = _taken_by(name, path)
    if taken is not None:
        raise ConfigError([(loc, f"{written}: the module name {name!r} is taken by {taken}; rename the file")])
    try:
        source_bytes = path.read_bytes()
    except OSError as err:
        raise ConfigError([(loc, f"{written} cannot be read: {err}")]) from None
    digest = "sha256:" + hashlib.sha256(source_bytes).hexdigest()
    if name in sys.modules:  # this very file, imported by its name already (it is beside the config, say)
        return LocalPlugin(str(path), sys.modules[name], path, digest)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # before it runs: dataclasses and pickling look the module up by name
    folder = str(path.parent)
    added = folder not in sys.path
    if added:  # as for a script run by Python: it may import the modules beside it
        sys.path.append(folder)
    try:
        exec(compile(source_bytes, str(path), "exec"), module.__dict__)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: a script's own exit must not end the command
        del sys.modules[name]
        forget_marks(name)
        if added:
            sys.path.remove(folder)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ConfigError([(loc, _failure(written, path, exc))]) from None
    return LocalPlugin(str(path), module, path, digest)


def _taken_by(name: str, path: Path) -> str | None:
    """What else answers to the module name ``name`` (None: nothing, or this file)."""
    module = sys.modules.get(name)
    if module is not None:
        other = getattr(module, "__file__", None)
        return None if other and Path(other).resolve() == path else (other or f"the module {name}")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or (spec.origin and Path(spec.origin).resolve() == path):
        return None
    return spec.origin or f"the package {name}"


def _identifier(name: str) -> str:
    return re.sub(r"\W", "_", name if name[:1].isalpha() or name[:1] == "_" else f"_{name}")


def _failure(written: str, source: Path | None, exc: BaseException) -> str:
    """``my_loss.py, line 3: SyntaxError: ...``: the innermost line of the plugin's file in the error's traceback
    (and the innermost line of all, where that is in another file)."""
    reason = str(exc) if isinstance(exc, RlzooError) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError) and exc.filename and source is not None and Path(exc.filename) == source:
        return f"{written}, line {exc.lineno}: {type(exc).__name__}: {exc.msg}"
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:  # in a module the plugin imports
        frames.append((exc.filename, exc.lineno))
    own = [line for filename, line in frames if source is not None and Path(filename) == source]
    if not own:
        return f"{written}: {reason}"
    inner = frames[-1]
    # where it failed, when that is in a module the plugin imports (rlzoo's own errors say what is wrong themselves)
    elsewhere = (
        f" ({inner[0]}, line {inner[1]})" if Path(inner[0]) != source and not isinstance(exc, RlzooError) else ""
    )
    return f"{written}, line {own[-1]}{elsewhere}: {reason}"
