"""The console of a run: what reaches the user's terminal, what goes to the run's log file, and the two summaries.

A run's console (``rlzoo train`` / ``rlzoo sft`` without ``--verbose``) shows:

- the start summary (:func:`start_summary`) and the final one (:func:`final_summary`), written to :attr:`Console.out`;
- the progress bars (tqdm, on ``sys.stderr``: one at a time, the cold start's then the RL loop's);
- warnings a user can act on: records of rlzoo's own loggers (``rlzoo*``, first-party plugins included) at WARNING
  and above, Python warnings raised from rlzoo code, and any library's ERROR;
- errors (``error: ...``) and tracebacks.

Everything else goes to ``<run folder>/log.txt``: the log records of vLLM, DeepSpeed, transformers and torch at INFO
and above, Python warnings raised elsewhere, and whatever an engine writes straight to the process's stdout or
stderr, from Python (``print``, a handler bound to ``sys.stdout``) or from C++ (torch's ``[W ...]`` lines, which
never pass through Python). To catch the last kind, file descriptors 1 and 2 point at the log file while the run
lasts; the console keeps duplicates of the original ones, ``sys.stderr`` is swapped for the duplicate of fd 2 (so the
progress bars, errors and tracebacks stay visible), and ``sys.stdout`` is left on fd 1 (the log file: what DeepSpeed
prints lands there). ``--verbose`` redirects nothing: every record at INFO and above, from every library, shows
on the console and also goes to the log file.

vLLM configures its own handler (to stdout) unless ``VLLM_CONFIGURE_LOGGING=0``; it is set here before vLLM is
imported, so its records reach the root logger and follow the rules above. MLflow (the ``mlflow`` logger) likewise
unless ``MLFLOW_CONFIGURE_LOGGING=false``, also set here. transformers' own handler is removed and its records
propagate likewise.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig

LOG_NAME = "log.txt"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONSOLE_FORMAT = "%(levelname)s %(name)s: %(message)s"
OURS = "rlzoo"  # logger names and package folders of the core and the first-party plugins start with this


def log_path(run_dir: Path, rank: int = 0) -> Path:
    """The run's log file; under a launcher the ranks other than 0 each write their own."""
    return Path(run_dir) / (LOG_NAME if rank == 0 else f"log.rank{rank}.txt")


class Actionable(logging.Filter):
    """Passes what a user can act on: rlzoo's own records at WARNING and above, and anyone's ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return record.levelno >= logging.WARNING and record.name.split(".")[0].startswith(OURS)


def is_our_file(filename: str) -> bool:
    """Whether ``filename`` is a source file of an imported ``rlzoo*`` package (the core, a first-party plugin). By
    the packages' own folders, not by name: a checkout cloned as ``rlzoo/`` holds a venv whose libraries are not."""
    path = os.path.abspath(filename)
    for name, module in list(sys.modules.items()):
        if name.startswith(OURS) and "." not in name and getattr(module, "__file__", None):
            if path.startswith(os.path.dirname(os.path.abspath(module.__file__)) + os.sep):
                return True
    return False


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` as a log record: ``rlzoo.warnings`` if raised from rlzoo code, else ``py.warnings``."""
    name = "rlzoo.warnings" if is_our_file(str(filename)) else "py.warnings"
    text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
    logging.getLogger(name).warning("%s", text)


def _route_library_loggers(verbose: bool) -> None:
    """Make vLLM, MLflow and transformers log through the root logger instead of handlers of their own."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # read when vLLM is first imported
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")  # read when MLflow is first imported
    try:
        import transformers.utils.logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    if not verbose:
        hf_logging.disable_progress_bar()  # a bar for every tiny save/load; ours are the ones worth watching


@dataclass
class Console:
    """Where a run's user-facing output goes (``out``: summaries; ``err``: bars, warnings, errors) and its log."""

    out: TextIO
    err: TextIO
    log_file: Path | None
    verbose: bool

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


@contextlib.contextmanager
def run_console(log_file: Path | None, verbose: bool = False) -> Iterator[Console]:
    """Route logging, warnings and the engines' output for the length of a run (see the module docstring).

    ``log_file`` None: no log file (and nothing redirected). Everything is restored on exit, before an exception
    propagates, so its traceback reaches the terminal.
    """
    with contextlib.ExitStack() as stack:
        root = logging.getLogger()
        saved_level, saved_handlers = root.level, root.handlers[:]
        saved_showwarning = warnings.showwarning
        saved_stdout, saved_stderr = sys.stdout, sys.stderr

        def restore_logging() -> None:
            for handler in root.handlers[:]:
                if handler not in saved_handlers:
                    handler.close()
            root.handlers[:] = saved_handlers
            root.setLevel(saved_level)
            warnings.showwarning = saved_showwarning

        stack.callback(restore_logging)
        _route_library_loggers(verbose)
        root.handlers[:] = []
        root.setLevel(logging.INFO)
        redirect = log_file is not None and not verbose
        if log_file is not None:
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
            file_handler = logging.FileHandler(log_file, encoding="utf-8")
            file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
            root.addHandler(file_handler)
        if redirect:
            out, err = stack.enter_context(_descriptors_to(Path(log_file)))
            sys.stderr = err
            stack.callback(setattr, sys, "stderr", saved_stderr)
            warnings.showwarning = _show_warning
        else:
            out, err = saved_stdout, saved_stderr
        console_handler = logging.StreamHandler(err)
        console_handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
        if not verbose:
            console_handler.addFilter(Actionable())
        root.addHandler(console_handler)
        yield Console(out=out, err=err, log_file=log_file, verbose=verbose)


@contextlib.contextmanager
def _descriptors_to(path: Path) -> Iterator[tuple[TextIO, TextIO]]:
    """Point fds 1 and 2 at ``path`` (appending); yield text streams on the original terminal's stdout and stderr."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    streams = {
        fd: io.TextIOWrapper(
            io.FileIO(os.dup(saved[fd]), "w"),
            encoding="utf-8",
            errors="replace",
            line_buffering=True,
            write_through=True,
        )
        for fd in (1, 2)
    }
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield streams[1], streams[2]
    finally:
        for stream in (sys.stdout, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(target)
        for stream in streams.values():
            with contextlib.suppress(Exception):
                stream.close()


# ---------------------------------------------------------------------------------------------------- summaries
def start_summary(
    command: str,
    config_file: str,
    config: RunConfig,
    output: Path,
    console: Console,
    resumed_changes: dict[str, tuple[object, object]] | None = None,
) -> list[str]:
    """What is about to run: the config file, the algorithm, the model, the engines, the output folder; for a
    resume (``resumed_changes`` given), what differs from the run's config and goes ahead."""
    from rlzoo.config.base import DEFAULT_ENVIRONMENT

    algo, rollout, loop = config.algorithm, config.rollout, config.train
    parts = [f"ratio {algo.ratio.name}", f"advantage {algo.advantage.name}", f"clipper {algo.clipper.name}"]
    parts.append(f"aggregation {algo.aggregation.name}")
    if algo.kl_coef > 0:
        parts.append(f"kl {algo.kl.name} x {algo.kl_coef:g}")
    if algo.router is not None:
        parts.append(f"router {algo.router.name}")
    preset = f"{algo.preset} preset: " if algo.preset else ""
    if config.model.path:
        model = f"{config.model.path} ({config.model.dtype})"
    else:
        model = f"tiny {config.model.tiny.architecture} built locally ({config.model.dtype})"
        if config.cold_start.enabled:
            model += f", cold start {config.cold_start.steps} SFT steps"
    teacher = config.teacher
    if command == "train" and teacher is not None:  # what scores the policy's tokens (on-policy distillation)
        tiny = teacher.tiny
        built = f"tiny {tiny.architecture} of hidden size {tiny.hidden_size}, cold-started" if tiny is not None else ""
        model += f"; teacher {teacher.model or built}"
    verifier = config.verifier.name if config.verifier is not None else "the task's default"
    lines = [f"rlzoo {command} {config_file}"]
    if command == "train":
        lines.append(f"  algorithm  {preset}{', '.join(parts)}")
    lines += [f"  model      {model}", f"  task       {config.task.name}, verifier {verifier}"]
    episode = config.episode
    if episode.max_turns > 1 or episode.tools or episode.environment.name != DEFAULT_ENVIRONMENT:
        tools = ", ".join(t.name for t in episode.tools) or "no tools"
        budget = f", {episode.max_tokens} tokens" if episode.max_tokens else ""
        lines.append(f"  episodes   {episode.environment.name} ({tools}), up to {episode.max_turns} turns{budget}")
    if command == "train":
        lines += [
            f"  engines    rollout {rollout.engine.name}, trainer {config.trainer.engine.name}",
            f"  schedule   {loop.steps} RL steps of {rollout.prompts_per_step} prompts x {rollout.group_size} "
            f"responses; held-out eval every {loop.eval_every} steps on {loop.eval_prompts} prompts",
        ]
    if command == "train" and config.loggers:
        lines.append(f"  loggers    metrics.jsonl, {', '.join(spec.name for spec in config.loggers)}")
    lines.append(f"  output     {output}")
    if resumed_changes is not None:
        from rlzoo.preflight.resume_changes import CHANGES_FILE, describe

        listed = describe(resumed_changes)
        lines.append(
            f"  resume     changes going ahead, recorded in {output / CHANGES_FILE}: {listed}"
            if listed
            else "  resume     with the run's config unchanged"
        )
    if console.log_file is not None and not console.verbose:
        lines.append(f"  log        {console.log_file} (engine messages; --verbose shows them here)")
    return lines


def final_summary(run_dir: Path, config_file: str, console: Console) -> list[str]:
    """How it went (held-out accuracy first and last evaluation, the faults it rode out) and where the results are."""
    from rlzoo.reporting.metrics_log import read_metrics

    run_dir = Path(run_dir)
    lines = []
    metrics = run_dir / "metrics.jsonl"
    rows = read_metrics(metrics) if metrics.is_file() else []
    evals = [r for r in rows if "eval/accuracy" in r]
    if evals:
        first, last = evals[0], evals[-1]
        lines.append(
            f"held-out accuracy: {first['eval/accuracy']:.3f} (step {first['step']}) -> "
            f"{last['eval/accuracy']:.3f} (step {last['step']})"
        )
        rewards = [row.get("eval/reward_mean") for row in (first, last)]
        if None not in rewards and rewards != [first["eval/accuracy"], last["eval/accuracy"]]:
            # a graded reward (a judge's score, a weighted sum): accuracy alone says little, or nothing
            lines.append(
                f"held-out reward:   {rewards[0]:.3f} (step {first['step']}) -> {rewards[1]:.3f} (step {last['step']})"
            )
    lines += fault_summary(rows) + scoring_summary(rows)
    lines.append(f"results in {run_dir}:")
    lines.append(f"  metrics      {metrics}")
    pointer = run_dir / "checkpoints" / "latest"
    if pointer.is_file():
        lines.append(
            f"  checkpoint   {pointer.parent / pointer.read_text().strip()} "
            f"(continue: rlzoo train {config_file} --resume {run_dir})"
        )
    if console.log_file is not None:
        lines.append(f"  log          {console.log_file}")
    lines.append(f"  plot         rlzoo plot {run_dir}")
    return lines


def fault_summary(rows: list[dict[str, float]]) -> list[str]:
    """The faults a run rode out that its metrics counted, in a line each (none: no line): episodes ended by their
    environment failing, and tool calls abandoned past their time budget with their threads still running in this
    process (:func:`rlzoo.tools.abandoned_calls`: Python cannot stop a thread)."""
    from rlzoo.tools import abandoned_calls

    lines = []
    failed = sum(r.get("episode/errors", 0.0) for r in rows)
    held_out = sum(r.get("eval/episode_errors", 0.0) for r in rows)
    if failed or held_out:
        lines.append(
            f"environment errors: {failed:g} training and {held_out:g} held-out episodes ended with reward 0 because "
            f"their environment failed (episode/errors, eval/episode_errors; the run's log has the first traceback)"
        )
    abandoned, running = sum(r.get("tool/abandoned", 0.0) for r in rows), abandoned_calls()
    if abandoned or running:
        lines.append(
            f"abandoned tool calls: {abandoned:g} in training ran past their time budget and were left running "
            f"(tool/abandoned), {running} thread(s) still running now; a tool that may hang should bound itself"
        )
    return lines


SCORING_COUNTS = ("requests", "cache_hits", "retries", "failures", "prompt_tokens", "completion_tokens")


def scoring_summary(rows: list[dict[str, float]]) -> list[str]:
    """What scoring by a service cost, a line per service verifier for the training steps (the sums of its
    ``<prefix>/requests``, ``cache_hits``, ``retries``, ``failures`` and, for a judge, tokens:
    :class:`rlzoo.services.ServiceStats`) and one for the held-out evaluations (``eval/<prefix>_requests``, ...).
    None: no line."""
    from rlzoo.services import service_prefixes

    keys = {key for row in rows for key in row}
    held_out = {key.removeprefix("eval/") for key in keys if key.startswith("eval/")}
    phases = {  # (prefix, where): how a count's key is spelled
        **{(prefix, "training steps"): f"{prefix}/{{}}" for prefix in service_prefixes(keys)},
        **{
            (prefix, "held-out evaluations"): f"eval/{prefix}_{{}}"
            for prefix in {
                key.removesuffix("_requests")
                for key in held_out
                if key.endswith("_requests") and key.removesuffix("_requests") + "_cache_hits" in held_out
            }
        },
    }
    lines = []
    for (prefix, where), spelling in sorted(
        phases.items(), key=lambda item: (item[0][0], item[0][1] != "training steps")
    ):
        total = {name: sum(row.get(spelling.format(name), 0.0) for row in rows) for name in SCORING_COUNTS}
        text = (
            f"scoring ({prefix}, {where}): {total['requests']:g} requests, {total['cache_hits']:g} cache "
            f"hits, {total['retries']:g} retries, {total['failures']:g} failed"
        )
        if total["prompt_tokens"] or total["completion_tokens"]:
            text += f"; {total['prompt_tokens']:g} prompt + {total['completion_tokens']:g} completion tokens"
        lines.append(text)
    return lines
