"""The ``rlzoo`` command line. User errors print as one clear message and exit 1, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlzoo.cli_parser import build_parser
from rlzoo.errors import RlzooError
from rlzoo.runtime import runlock, signals

if TYPE_CHECKING:
    from rlzoo.models.memory import MemoryEstimate


def _registry():
    from rlzoo.registry import default_registry

    registry = default_registry()
    if not getattr(registry, "_warned", False):
        for error in registry.load_errors:
            print(f"warning: {error}", file=sys.stderr)
        registry._warned = True
    return registry


def cmd_plugins_list(args: argparse.Namespace) -> int:
    from rlzoo.local_plugins import load_plugins

    registry = _registry()
    load_plugins(args.plugin or [], registry, "--plugin", Path.cwd())
    rows = [
        {
            "kind": i.kind,
            "name": i.name,
            "distribution": i.distribution,
            "plugin": i.plugin,
            "summary": i.summary,
            "duplicate": i.duplicate,
        }
        for i in registry.components()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    widths = [max([len(r[k]) for r in rows] + [len(k)]) for k in ("kind", "name", "distribution")]
    print(f"{'kind':<{widths[0]}}  {'name':<{widths[1]}}  {'distribution':<{widths[2]}}  summary")
    for r in rows:
        mark = "[registered twice: a config naming it fails] " if r["duplicate"] else ""
        print(
            f"{r['kind']:<{widths[0]}}  {r['name']:<{widths[1]}}  {r['distribution']:<{widths[2]}}  {mark}{r['summary']}"
        )
    return 0


def _load(args: argparse.Namespace):
    from rlzoo.config.resolution import load_config

    return load_config(args.config, args.set or [], _registry(), plugins=args.plugin or [])


def cmd_config_check(args: argparse.Namespace) -> int:
    from rlzoo.config.loading import dump_config
    from rlzoo.preflight.checks import preflight
    from rlzoo.preflight.memory_fit import device_memory_limit

    device_memory = _device_memory(args.device_memory)
    config = _load(args)
    # the same checks `rlzoo train` makes before it starts (train reads the process count from its launcher)
    runlock.check_run_folder(Path(args.resume or config.output_dir), resume=args.resume is not None)
    memory = preflight(
        config,
        _registry(),
        resume=Path(args.resume) if args.resume else None,
        world=args.processes,
        model_config=Path(args.model_config) if args.model_config else None,
        device_memory=device_memory,
        allow_changes=args.allow_changes or [],
    )
    limit = device_memory_limit(config, device_memory)
    if memory is not None:
        print("".join(f"# {line}\n" for line in _memory_report(memory, args.processes, limit)), end="")
    print(dump_config(config), end="")
    return 0


def _device_memory(text: str | None) -> int | None:
    """``--device-memory`` in bytes; a bad value is a config error naming the flag."""
    from rlzoo.errors import ConfigError
    from rlzoo.util.units import parse_bytes

    try:
        return parse_bytes(text) if text is not None else None
    except ValueError as err:
        raise ConfigError([("--device-memory", str(err))]) from None


def _memory_report(memory: MemoryEstimate, processes: int, limit: tuple[str, int] | None) -> list[str]:
    """The estimate per rank as YAML comment lines (the printed config stays valid YAML): for a model of GPU size,
    or whenever a device memory is known; nothing for the tiny CPU models. Then a rollout pool's placement and
    memory per server, if the rollout engine has one (vllm-server), for any model."""
    from rlzoo.models.memory import GPU_SCALE_PARAMETERS
    from rlzoo.util.units import format_bytes

    pool = list(memory.rollout_pool)  # rollout servers on devices of their own: printed for any model
    if limit is None and memory.parameters < GPU_SCALE_PARAMETERS:
        return pool
    device = f"; fits {format_bytes(limit[1])} ({limit[0]})" if limit is not None else ""
    head = f"GPU memory per rank, estimated (rlzoo.models.memory), {processes} process(es){device}:"
    return [head, *(f"  {line}" for line in memory.lines(limit[1] if limit is not None else None)), *pool]


def cmd_train(args: argparse.Namespace) -> int:
    from rlzoo.preflight.checks import preflight
    from rlzoo.preflight.resume_changes import config_changes
    from rlzoo.reporting.console import final_summary, log_path, run_console, start_summary
    from rlzoo.runtime import distributed
    from rlzoo.runtime.run import TrainingRun

    config, registry = _load(args), _registry()
    resume = Path(args.resume) if args.resume else None
    run_dir = resume or Path(config.output_dir)
    rank = int(os.environ.get("RANK", "0"))  # under torchrun / deepspeed every rank gets here; rank 0 reports
    if rank == 0:  # a folder another process is writing: say by whom before anything else (rlzoo.runtime.runlock)
        runlock.check_run_folder(run_dir, resume=resume is not None)
    world = distributed.launched_world_size()
    preflight(config, registry, resume=resume, world=world, allow_changes=args.allow_changes or [])  # before any file
    # one writer per run folder: rank 0 holds its lock from before the first file is written until the run ends
    # how to run it again: the --plugin files too, since a resume reads the user's config, not the run's config.yaml
    again = args.config + "".join(f" --plugin {shlex.quote(path)}" for path in args.plugin or [])
    command = f"rlzoo train {again}" + (f" --resume {resume}" if resume is not None else "")
    hold = runlock.hold_run_folder(run_dir, command, resume is not None) if rank == 0 else contextlib.nullcontext()
    since = time.time()
    try:
        with hold, run_console(log_path(run_dir, rank), args.verbose) as console:
            if rank == 0:
                changes = config_changes(resume, config, registry) if resume is not None else None
                console.print("\n".join(start_summary("train", args.config, config, run_dir, console, changes)))
            run_dir = TrainingRun(config, registry, resume).run()
            if rank == 0:
                console.print("\n".join(final_summary(run_dir, again, console)))
    except BaseException as err:  # SIGINT / SIGTERM (or an error while stopping for one): where it stopped
        signum = signals.stop_signal(err)
        if signum is None:
            raise
        if rank == 0:
            steps = config.train.steps
            message = signals.stopped_message(signum, run_dir, again, steps, bool(args.set), since)
        else:
            message = f"interrupted by {signals.signal_name(signum)} (rank {rank})"
        raise signals.Interrupted(signum, message) from None
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from rlzoo.reporting.console import log_path, run_console, start_summary
    from rlzoo.runtime.assembly import initial_model_dir, make_task
    from rlzoo.runtime.cold_start import cold_start_dir
    from rlzoo.runtime.faults import naming_components

    config, registry = _load(args), _registry()
    hold = runlock.hold_run_folder(Path(config.output_dir), f"rlzoo sft {args.config}")  # its log.txt is there
    with hold, run_console(log_path(Path(config.output_dir)), args.verbose) as console:
        console.print("\n".join(start_summary("sft", args.config, config, cold_start_dir(config), console)))
        with naming_components(registry, Path(config.output_dir)):  # a component's bug: one line naming it
            directory = initial_model_dir(config, make_task(config, registry), registry)
        report = directory / "cold_start.json"
        console.print(report.read_text() if report.is_file() else f"model: {directory}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A checkpoint's LoRA adapters merged into their base, as a plain Hugging Face folder; the checkpoint's files
    verified against its digests.json first, as --resume does (the checks of the adapters and the base:
    rlzoo.engines.lora.export_merged)."""
    from rlzoo.engines.lora import ADAPTER_CONFIG, export_merged
    from rlzoo.runtime.checkpoint.digests import MANIFEST, verify_checkpoint

    source, output = Path(args.checkpoint), Path(args.output)
    if not source.is_dir():
        raise RlzooError(f"export: {source} is not a folder; name a checkpoint (checkpoints/step_N) or its model/")
    if source.name != "model" and (source / "model").is_dir():
        source = source / "model"  # a checkpoints/step_N folder
    if not (source / ADAPTER_CONFIG).is_file():
        hint = " (already a plain Hugging Face folder: use it as it is)" if (source / "config.json").is_file() else ""
        raise RlzooError(f"export: {source} holds no LoRA adapters (no {ADAPTER_CONFIG}){hint}")
    if (source.parent / MANIFEST).is_file():  # a checkpoint's model/ folder: only its files are read
        check = verify_checkpoint(source.parent, within=source.name)
        if not check.intact:
            raise RlzooError(
                f"export: checkpoint {source.parent} is damaged ({'; '.join(check.problems)}); export "
                "an earlier checkpoint, or restore the files from a copy"
            )
    if output.exists() and not output.is_dir():
        raise RlzooError(f"export: {output} is a file; choose a new or empty folder")
    if output.exists() and any(output.iterdir()):
        raise RlzooError(f"export: {output} exists and is not empty; choose another folder")
    print(export_merged(source, output, Path(args.base) if args.base else None))
    return 0


def cmd_model_import(args: argparse.Namespace) -> int:
    """A GGUF model as a Hugging Face folder (rlzoo.models.gguf_import)."""
    from rlzoo.models.gguf_import import import_gguf
    from rlzoo.reporting.console import run_console

    with tempfile.TemporaryDirectory() as scratch, run_console(Path(scratch) / "log.txt", args.verbose) as console:
        # transformers' and vLLM's messages and progress bars go to a log that is dropped (fd 2 is that log now,
        # unless --verbose)
        with contextlib.redirect_stderr(sys.stderr if args.verbose else sys.__stderr__):
            imported = import_gguf(args.file, args.output, dtype=args.dtype, hf_only=args.hf_only)
        console.print(str(imported))
    return 0


def cmd_serve_verifier(args: argparse.Namespace) -> int:
    from rlzoo.runtime.assembly import make_task, verifier_for
    from rlzoo.services.server import app_for, serve

    config = _load(args)
    verifier = verifier_for(config, make_task(config, _registry()), _registry())
    app = app_for(verifier, args.concurrency)  # says which extra to install if fastapi is missing
    print(
        f"serving verifier {verifier.name} on http://{args.host}:{args.port} (GET /health, POST /verify_batch)",
        flush=True,
    )
    serve(app, args.host, args.port)
    return 0


def cmd_check_verifier(args: argparse.Namespace) -> int:
    """The config's verifier scored on pairs of a better and a worse response (rlzoo.verifier_check)."""
    from rlzoo.verifier_check import check, checked_verifier, read_pairs, table

    pairs = read_pairs(Path(args.pairs))
    verifier = checked_verifier(_load(args), _registry())
    rows, errors = check(verifier, pairs)
    print(table(rows, errors, verifier.name))
    return 0


def cmd_serve_rollouts(args: argparse.Namespace) -> int:
    """The command that starts one of the config's vLLM servers (``rollout.engine: vllm-server``) on another node:
    stdout is that one line; how to use it goes to stderr."""
    from rlzoo.engines.vllm_server.rollout import node_command_for
    from rlzoo.runtime.assembly import create
    from rlzoo.runtime.cold_start import cold_start_dir

    config = _load(args)
    model = args.model or config.model.path or str(cold_start_dir(config))
    engine = create(_registry(), "rollout_engine", config.rollout.engine)
    print(node_command_for(engine, config, str(model), args.host, args.port))
    print(
        f"# on the rollout node, with rlzoo installed (vLLM finds its rlzoo-gloo plugin) and the model at {model} "
        f"(--model DIR: another path); then rollout.engine.servers: ['http://NODE:{args.port}']",
        file=sys.stderr,
    )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from rlzoo.reporting.plot import plot_run

    for path in plot_run(Path(args.run_dir)):
        print(path)
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from rlzoo.sweep.ablate import AblateOptions, ablate, report

    options = AblateOptions(
        config=args.config,
        vary=args.vary or [],
        seeds=args.seeds,
        out=Path(args.out),
        sets=args.set or [],
        jobs=args.jobs,
        backend=args.backend,
        ray_address=args.ray_address,
        cpus_per_run=args.cpus_per_run,
        max_runs=args.max_runs,
        yes=args.yes,
        plugins=args.plugin or [],
        drop_finished_checkpoints=args.drop_finished_checkpoints,
    )
    try:
        sweep, status = ablate(options, _registry())
    except KeyboardInterrupt as err:  # SIGINT / SIGTERM: the runs were stopped (rlzoo.sweep.local); how to go on
        signum = signals.stop_signal(err)
        raise signals.Interrupted(
            signum,
            f"interrupted by {signals.signal_name(signum)}: the sweep's running jobs were stopped; rerun the same "
            "command to resume it (finished runs are kept, stopped ones continue from their last checkpoint)",
        ) from None
    try:
        for path in report([sweep.out], sweep.out, str(sweep.out)):
            print(path)
    except RlzooError as err:  # no run has metrics yet (all failed): the failures below say why
        print(f"no summary: {err}", file=sys.stderr)
    failed = sorted(name for name, code in status.items() if code != 0)
    if failed:
        print(
            f"{len(failed)} job(s) failed: {', '.join(failed)} (logs: <run folder>/process.log); rerun the same "
            "command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from rlzoo.sweep.ablate import report

    paths = [Path(p) for p in args.dirs]
    out = Path(args.out) if args.out else (paths[0] if len(paths) == 1 else Path("."))
    for path in report(paths, out, " vs ".join(args.dirs)):
        print(path)
    return 0


def cmd_mismatch(args: argparse.Namespace) -> int:
    from rlzoo.mismatch.command import run

    return run(args, _load, _registry)


def parser() -> argparse.ArgumentParser:
    """The command line's parser, each command's function set as its ``func``."""
    commands = {
        "plugins_list": cmd_plugins_list,
        "config_check": cmd_config_check,
        "train": cmd_train,
        "sft": cmd_sft,
        "ablate": cmd_ablate,
        "compare": cmd_compare,
        "export": cmd_export,
        "model_import": cmd_model_import,
        "serve_verifier": cmd_serve_verifier,
        "check_verifier": cmd_check_verifier,
        "serve_rollouts": cmd_serve_rollouts,
        "plot": cmd_plot,
        "mismatch": cmd_mismatch,
    }
    return build_parser(commands)


def main(argv: list[str] | None = None) -> int:
    # SIGTERM is handled as SIGINT: the command stops, says where, and exits 128 + the signal's number; a second
    # signal ends it at once (rlzoo.runtime.signals)
    with signals.stop_signals():
        try:
            return _main(argv)
        except KeyboardInterrupt as err:  # wherever it lands (an Interrupted from train says where the run stopped)
            signum = signals.stop_signal(err)
            print(getattr(err, "message", None) or f"interrupted by {signals.signal_name(signum)}", file=sys.stderr)
            signals.stop_children()  # none left behind (engine or sweep processes still running)
            return 128 + signum


def _main(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    # train and sft set up their own console and log file (rlzoo.reporting.console); the other commands only need this
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except RlzooError as err:
        if args.verbose:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
