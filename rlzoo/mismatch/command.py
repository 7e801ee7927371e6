"""``rlzoo mismatch CONFIG [--set ...] [--steps N] [--out DIR] [--fail-above METRIC=VALUE ...]``: its options and
its course (docs/mismatch.md).

    the flags checked (steps, bounds)              before anything starts: a bad one is one line, exit 1
    the config loaded and checked as train does    (preflight), measured in DIR (default <output_dir>/mismatch)
    N batches measured (rlzoo.mismatch.session)    the progress bar on the console, the engines' output in DIR/log.txt
    --causes: the same with one thing changed      (rlzoo.mismatch.causes; staleness: real updates, never saved)
    every registered correction on the batch       (rlzoo.mismatch.corrections; the config's with its parameters),
      and its policy gradient against the on-policy one    (rlzoo.mismatch.gradients, during the measurement)
    mismatch.md, .json, .png; the summary          (rlzoo.mismatch.report)
    the bounds compared                            one line per exceeded bound on stderr, exit 1

This module imports nothing heavy at import time: the CLI's parser takes its options from :func:`add_arguments`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlzoo.errors import RlzooError

DEFAULT_STEPS = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``mismatch`` command's own options on its parser ``p`` (:mod:`rlzoo.cli_parser` adds the config's)."""
    p.add_argument(
        "--steps",
        default=str(DEFAULT_STEPS),
        metavar="N",
        help=f"rollout batches to measure, all under the same weights (default {DEFAULT_STEPS})",
    )
    p.add_argument("--out", metavar="DIR", help="where the report goes (default: <output_dir>/mismatch)")
    p.add_argument(
        "--fail-above",
        action="append",
        metavar="METRIC=VALUE",
        help="exit 1 when the measured METRIC exceeds VALUE (repeatable; e.g. abs_logp_diff=0.05)",
    )
    p.add_argument(
        "--causes",
        action="store_true",
        help="measure again with one thing changed at a time (each side's precision, batch composition, routing, the "
        "engine; staleness: 1 and 2 real updates ahead, never saved) and say how much of the gap each explains",
    )


class Bar:
    """The measurement's progress bar, drawn from the first batch on (after the cold start's own bar, if any)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: Any = None  # a tqdm bar once drawn

    def tick(self, n: int) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc="mismatch", dynamic_ncols=True, mininterval=1.0)
        self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.total = self.bar.n  # a cause that could not be measured (e.g. no routing) ran no batch
            self.bar.close()


def _steps(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise RlzooError(f"--steps: {text!r} is not a positive whole number")
    return int(text)


def run(args: argparse.Namespace, load: Callable, registry_of: Callable) -> int:
    """The command's course (module docstring); 0, or 1 when a bound is exceeded."""
    from rlzoo.mismatch.gate import exceeded, parse_bounds

    steps, bounds = _steps(args.steps), parse_bounds(args.fail_above or [])  # before anything starts
    from rlzoo.mismatch.causes import STALENESS, causes_count, measure_causes
    from rlzoo.mismatch.corrections import build_corrections
    from rlzoo.mismatch.report import build_result, summary, write
    from rlzoo.mismatch.session import Asked, measure_config, measurement_config
    from rlzoo.preflight.checks import preflight
    from rlzoo.reporting.console import log_path, run_console, start_summary

    config, registry = load(args), registry_of()
    out = Path(args.out) if args.out else Path(config.output_dir) / "mismatch"
    measuring = measurement_config(config, out)
    preflight(measuring, registry)
    rollout_dtype, trainer_dtype = config.model.dtype, config.trainer.dtype  # each side's precision
    with run_console(log_path(out), args.verbose) as console:
        lines = start_summary("mismatch", args.config, measuring, out, console)
        lines.insert(
            -1 if console.log_file is not None and not args.verbose else len(lines),
            f"  engines    rollout {config.rollout.engine.name} ({rollout_dtype}) vs trainer "
            f"{config.trainer.engine.name} ({trainer_dtype}); {steps} batch(es) of "
            f"{config.rollout.prompts_per_step} prompts x {config.rollout.group_size}, "
            + ("then 1-2 updates for staleness, never saved" if args.causes else "no update"),
        )
        console.print("\n".join(lines))
        stale = STALENESS if args.causes else ()
        total = steps * (1 + (causes_count(measuring, registry) if args.causes else 0)) + max(stale, default=0)
        bar = Bar(total)
        corrections, skipped = build_corrections(registry, config.algorithm.correction)
        asked = Asked(alone=args.causes, corrections=corrections, stale=stale)
        try:
            measured = measure_config(measuring, registry, steps, bar.tick, asked)
            causes = measure_causes(measuring, registry, steps, measured, bar.tick) if args.causes else None
        finally:
            bar.close()
        about = {
            "config": args.config,
            "engines": {
                "rollout": config.rollout.engine.name,
                "rollout_dtype": rollout_dtype,
                "trainer": config.trainer.engine.name,
                "trainer_dtype": trainer_dtype,
            },
            "causes": causes,
            "corrections_not_built": skipped,
        }
        result = build_result(measured, corrections, about)
        files = write(measured, result, out)
        console.print("\n".join([*summary(result), *(f"  {f.name:<15}{f}" for f in files)]))
    failed = exceeded(result["metrics"], bounds)
    for line in failed:
        print(f"error: mismatch above its bound: {line}", file=sys.stderr)
    return 1 if failed else 0
