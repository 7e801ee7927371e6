"""The ``rlzoo`` command line. User errors print as one clear message and exit 1, never a traceback."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from rlzoo.errors import RlzooError


def _registry():
    from rlzoo.registry import default_registry

    registry = default_registry()
    if not getattr(registry, "_warned", False):
        for error in registry.load_errors:
            print(f"warning: {error}", file=sys.stderr)
        registry._warned = True
    return registry


def cmd_plugins_list(args: argparse.Namespace) -> int:
    registry = _registry()
    rows = [
        {"kind": i.kind, "name": i.name, "distribution": i.distribution, "plugin": i.plugin, "summary": i.summary}
        for i in registry.components()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    widths = [max([len(r[k]) for r in rows] + [len(k)]) for k in ("kind", "name", "distribution")]
    print(f"{'kind':<{widths[0]}}  {'name':<{widths[1]}}  {'distribution':<{widths[2]}}  summary")
    for r in rows:
        print(f"{r['kind']:<{widths[0]}}  {r['name']:<{widths[1]}}  {r['distribution']:<{widths[2]}}  {r['summary']}")
    return 0


def _load(args: argparse.Namespace):
    from rlzoo.config import load_config

    return load_config(args.config, args.set or [], _registry())


def cmd_config_check(args: argparse.Namespace) -> int:
    from rlzoo.config import dump_config
    from rlzoo.preflight import preflight

    config = _load(args)
    # the same checks `rlzoo train` makes before it starts (train reads the process count from its launcher)
    preflight(
        config, _registry(), resume=Path(args.resume) if args.resume else None, world=args.processes,
        model_config=Path(args.model_config) if args.model_config else None,
    )
    print(dump_config(config), end="")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from rlzoo import distributed
    from rlzoo.console import final_summary, log_path, run_console, start_summary
    from rlzoo.preflight import preflight
    from rlzoo.run import TrainingRun

    config, registry = _load(args), _registry()
    resume = Path(args.resume) if args.resume else None
    preflight(config, registry, resume=resume, world=distributed.launched_world_size())  # before any file is made
    run_dir = resume or Path(config.output_dir)
    rank = int(os.environ.get("RANK", "0"))  # under torchrun / deepspeed every rank gets here; rank 0 reports
    with run_console(log_path(run_dir, rank), args.verbose) as console:
        if rank == 0:
            console.print("\n".join(start_summary("train", args.config, config, run_dir, console)))
        run_dir = TrainingRun(config, registry, resume).run()
        if rank == 0:
            console.print("\n".join(final_summary(run_dir, args.config, console)))
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from rlzoo.console import log_path, run_console, start_summary
    from rlzoo.run import initial_model_dir, make_task
    from rlzoo.sft import cold_start_dir

    config, registry = _load(args), _registry()
    with run_console(log_path(Path(config.output_dir)), args.verbose) as console:
        console.print("\n".join(start_summary("sft", args.config, config, cold_start_dir(config), console)))
        directory = initial_model_dir(config, make_task(config, registry), registry)
        report = directory / "cold_start.json"
        console.print(report.read_text() if report.is_file() else f"model: {directory}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from rlzoo.plot import plot_run

    for path in plot_run(Path(args.run_dir)):
        print(path)
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="rlzoo", description=__doc__)
    verbose_help = "show every library's messages on the console, and tracebacks"
    root.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    sub = root.add_subparsers(dest="command", required=True)

    plugins = sub.add_parser("plugins", help="inspect installed components").add_subparsers(dest="action", required=True)
    listing = plugins.add_parser("list", help="every registered component")
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    listing.set_defaults(func=cmd_plugins_list)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("config", help="YAML run config")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable)")
        return p

    def verbose(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        # also after the command (`rlzoo train CONFIG --verbose`); SUPPRESS keeps the root option's value otherwise
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
        return p

    config = sub.add_parser("config", help="config tools").add_subparsers(dest="action", required=True)
    check = with_config(config.add_parser("check", help="validate a config as `train` would, and print it resolved"))
    check.add_argument("--resume", metavar="RUN_DIR", help="check it as `train --resume RUN_DIR` would")
    check.add_argument(
        "--processes", type=_positive, default=1, metavar="N", help="check it for N processes (torchrun --nproc_per_node N)"
    )
    check.add_argument(
        "--model-config", metavar="CONFIG_JSON",
        help="check the model's shapes from this config.json instead of the model.path folder, for a recipe whose "
        "model is not on this machine (weights, tokenizer and chat template are then not checked)",
    )
    check.set_defaults(func=cmd_config_check)

    train = verbose(with_config(sub.add_parser("train", help="run RL post-training")))
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    train.set_defaults(func=cmd_train)

    sft = verbose(with_config(sub.add_parser("sft", help="build the cold-start model (supervised)")))
    sft.set_defaults(func=cmd_sft)

    plot = sub.add_parser("plot", help="draw a run's curves as PNG files")
    plot.add_argument("run_dir")
    plot.set_defaults(func=cmd_plot)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # train and sft set up their own console and log file (rlzoo.console); the other commands only need this
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except RlzooError as err:
        if args.verbose:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
