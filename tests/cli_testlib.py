"""``rlzoo ...`` run in this process as a fresh ``rlzoo`` process would run it, for the fault tables.

A subprocess pays seconds importing torch; :func:`run_cli` calls :func:`rlzoo.cli.main` instead, with what a fresh
process would have: its own working folder and environment variables, no logging handlers (so the CLI's
``logging.basicConfig`` takes effect, as it does in a new process), a registry discovered anew and no script plugin
loaded yet (a load warning is printed again, a ``--plugin`` file's components do not outlive the call), and file
descriptors 1 and 2 pointed at files of its own (a run's console writes to duplicates of them, not to
``sys.stdout``). An exception escaping ``main`` is printed as Python prints it, exit 1, so a table's "no traceback"
rule still sees it.

Everything the call may change in the process is put back afterwards: the working folder, ``os.environ``,
``sys.path``, the script plugins loaded (``rlzoo.local_plugins``), every logger's handlers, level and propagation,
transformers' progress bars, the warnings filters, torch's thread count and global random state, and the modules
imported from ``cwd`` (a ``--plugin`` script) with what ``rlzoo.register`` marked in them. Not thread-safe (working
folder, descriptors): the tables run their in-process cases one after the other.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class CliResult:
    """What the tables read of a :class:`subprocess.CompletedProcess`."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def run_cli(argv: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> CliResult:
    """``rlzoo *argv`` in ``cwd`` with the environment ``env`` (default: this one); its exit code and what it
    printed."""
    from rlzoo.cli import main

    argv = [str(a) for a in argv]
    with _fresh_process(Path(cwd).resolve(), env), _captured() as (out, err):
        try:
            code = main(argv)
        except SystemExit as stop:  # argparse's usage errors: exit 2
            code = stop.code if isinstance(stop.code, int) else 1
        except Exception:  # what a new process would print before exiting 1
            traceback.print_exc()
            code = 1
    return CliResult(argv, code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _fresh_process(cwd: Path, env: dict[str, str] | None) -> Iterator[None]:
    import torch

    from rlzoo import local_plugins
    from rlzoo.registry import default_registry, forget_marks

    folder, environ, sys_path = os.getcwd(), dict(os.environ), sys.path[:]
    modules, scripts = set(sys.modules), dict(local_plugins._LOADED)
    loggers = _logger_state()
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    bars = _progress_bars()
    root = logging.getLogger()
    try:
        with warnings.catch_warnings():
            os.chdir(cwd)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            root.handlers[:] = []
            default_registry.cache_clear()
            local_plugins._LOADED.clear()
            yield
    finally:
        default_registry.cache_clear()
        local_plugins._LOADED.clear()  # the scripts this process loaded, by path: a new process has loaded none
        local_plugins._LOADED.update(scripts)
        os.chdir(folder)
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = sys_path
        for name in set(sys.modules) - modules:  # a script beside the config, loaded as a plugin
            file = getattr(sys.modules[name], "__file__", None) or ""
            if file.startswith(str(cwd) + os.sep):
                del sys.modules[name]
                forget_marks(name)
        _restore_loggers(loggers)
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)
        _restore_progress_bars(bars)


def _logger_state() -> dict[str, tuple]:
    every = {"": logging.getLogger()}
    every.update({n: lg for n, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)})
    return {name: (lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for name, lg in every.items()}


def _restore_loggers(saved: dict[str, tuple]) -> None:
    for name, logger in [("", logging.getLogger()), *logging.root.manager.loggerDict.items()]:
        if not isinstance(logger, logging.Logger):
            continue
        before = saved.get(name)
        kept = before[1] if before is not None else []
        for handler in logger.handlers[:]:
            if handler not in kept:  # added by the call (basicConfig's stderr handler, a run's log file)
                handler.close()
        if before is None:
            logger.handlers[:] = []
            logger.setLevel(logging.NOTSET)
            logger.propagate, logger.disabled = True, False
        else:
            _, handlers, level, propagate, disabled = before
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, disabled


def _progress_bars() -> bool | None:
    try:
        import transformers.utils.logging as hf_logging
    except ImportError:
        return None
    return hf_logging.is_progress_bar_enabled()


def _restore_progress_bars(enabled: bool | None) -> None:
    if enabled is None:
        return
    import transformers.utils.logging as hf_logging

    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()


@contextlib.contextmanager
def _captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Descriptors 1 and 2 and ``sys.stdout``/``sys.stderr`` on two files of their own; their text, once done, in
    the two :class:`io.StringIO` yielded."""
    out, err = io.StringIO(), io.StringIO()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    saved_fds = {fd: os.dup(fd) for fd in (1, 2)}
    saved_streams = sys.stdout, sys.stderr
    files = {fd: tempfile.TemporaryFile(mode="w+b") for fd in (1, 2)}
    streams = {
        fd: open(os.dup(fd_file.fileno()), "w", encoding="utf-8", errors="replace", buffering=1)
        for fd, fd_file in files.items()
    }
    try:
        for fd, fd_file in files.items():
            os.dup2(fd_file.fileno(), fd)
        sys.stdout, sys.stderr = streams[1], streams[2]
        yield out, err
    finally:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__, *streams.values()):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved_streams
        for fd, copy in saved_fds.items():
            os.dup2(copy, fd)
            os.close(copy)
        for stream in streams.values():
            stream.close()
        for fd, text in ((1, out), (2, err)):
            files[fd].seek(0)
            text.write(files[fd].read().decode("utf-8", errors="replace"))
            files[fd].close()
