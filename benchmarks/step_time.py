"""One-shot step time of the SmolLM2 example with the hf rollout engine and the torch training engine on
``device: auto`` (the GPU when there is one): mean seconds per step after the first, by phase, and the host
synchronisations per step, by phase.

    python benchmarks/step_time.py MODEL_DIR [--steps 6] [--out RUN_DIR] [--set key=value ...]

Host synchronisations: the script counts the calls that wait for the device when their tensor lives on a GPU
(``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool()``, ``float()``, ``int()`` of any tensor, host-side
ones included: an upper bound; a boolean-mask selection or a blocking copy is not counted). Each is attributed to
the step phase (``time/<phase>``) running at the time.

It uses only the CLI, ``rlzoo.rl.loop.rl_step`` and the step's timer, so one copy of it measures two commits side
by side: run it with each checkout's packages first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


class SyncCounter:
    """Host synchronisations by phase: the calls in :data:`READS` on any tensor (on a GPU each waits for the device
    when the tensor lives there; host-side ones are counted too, so it is an upper bound). CUDA's own sync debug
    mode is not used: its warnings go through :mod:`warnings`, which the CLI routes to the run's log."""

    def __init__(self) -> None:
        import torch

        self.counts: collections.Counter[str] = collections.Counter()
        self.phase = ["other"]
        self.active = False
        for name in READS:
            setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name)))

    def add(self) -> None:
        if self.active:
            self.counts[self.phase[-1]] += 1

    def _counting(self, method):
        def counted(*args, **kwargs):
            self.add()
            return method(*args, **kwargs)

        return counted

    @contextmanager
    def in_phase(self, name: str):
        self.phase.append(name)
        try:
            yield
        finally:
            self.phase.pop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", help="the run folder, new (default: a fresh temporary one)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    import torch

    from rlzoo import cli
    from rlzoo.rl import loop
    from rlzoo.util.timer import Timer

    counter = SyncCounter()
    per_step: list[collections.Counter[str]] = []
    step, timed, phases = loop.rl_step, Timer.__call__, set()

    def counted_step(*a, **k):
        counter.counts, counter.active = collections.Counter(), True
        try:
            return step(*a, **k)
        finally:
            counter.active = False
            per_step.append(counter.counts)

    @contextmanager
    def phase(self, name):
        phases.add(name)
        with counter.in_phase(name), timed(self, name):
            yield

    loop.rl_step, Timer.__call__ = counted_step, phase
    out = Path(args.out or tempfile.mkdtemp(prefix="step-time-"))
    sets = {
        "model.path": args.model_dir,
        "output_dir": str(out),
        "device": "auto",
        "rollout.engine": "{name: hf, batch_size: 128}",
        "trainer.engine": "{name: torch}",
        "train.steps": str(args.steps),
        "train.eval_every": str(args.steps + 1),
        "train.checkpoint_every": str(args.steps + 1),
    }
    argv = ["train", str(Path(__file__).resolve().parents[1] / "examples" / "smollm2_arithmetic.yaml")]
    for item in [f"{k}={v}" for k, v in sets.items()] + args.set:
        argv += ["--set", item]
    start = time.perf_counter()
    code = cli.main(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"rlzoo train exit {code} after {time.perf_counter() - start:.1f} s on {device}; run folder {out}")
    if code != 0:
        return code
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/train" in r][1:]  # the first step warms up
    if not rows:
        print("no step after the first to measure")
        return 1
    phases = sorted(phases)  # the timer's phases (other time/* keys are parts of them)
    syncs = per_step[1 : len(rows) + 1]
    total = statistics.mean(sum(r.get("time/" + p, 0.0) for p in phases) for r in rows)
    print(f"steps 2-{len(rows) + 1}: mean s/step {total:.3f}")
    for p in phases:
        seconds = statistics.mean(r.get("time/" + p, 0.0) for r in rows)
        if seconds < 5e-4 and not any(c[p] for c in syncs):  # a phase this run skips (critic, teacher, ...)
            continue
        print(f"  {p:<16} {seconds:8.3f} s   host syncs/step {statistics.mean(c[p] for c in syncs):8.1f}")
    print(f"  {'(outside)':<16} {'':8}     host syncs/step {statistics.mean(c['other'] for c in syncs):8.1f}")
    print(f"host syncs/step, all: {statistics.mean(sum(c.values()) for c in syncs):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
