"""Why the producer thread of ``rollout.max_staleness`` can slow the trainer on CPU: a second thread's OpenMP team.

    python benchmarks/openmp_threads.py [--repeats 3] [--iterations 30]

torch on CPU runs its parallel ops on an OpenMP team per calling thread. Once a second Python thread (the rollout
producer) has run one parallel op, the process holds two teams: more OpenMP threads than cores, and libgomp then
shortens how long its idle threads spin before sleeping, so every parallel op of the first thread pays a wake-up.
This measures the first thread's forward + backward of a small MLP (hidden 576, SmolLM2-135M's width; 512 rows):

    alone                 no second thread
    idle second thread    a second thread ran one parallel op and now waits (the producer between batches)
    ... 1 thread          the same, the second thread set to one torch thread before its op (no second team)
    ... OMP_WAIT_POLICY   the same as "idle second thread", with OMP_WAIT_POLICY=ACTIVE

Each variant runs in its own process (the OpenMP setting is read at start), the variants round-robin ``--repeats``
times; the table prints the median seconds and the ratio to "alone" measured in the same invocation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

VARIANTS = {
    "alone": ("none", {}),
    "idle second thread": ("team", {}),
    "idle second thread, 1 thread": ("single", {}),
    "idle second thread, OMP_WAIT_POLICY=ACTIVE": ("team", {"OMP_WAIT_POLICY": "ACTIVE"}),
}

CHILD = """
import sys, threading, time, torch
second, iterations = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(576, 576) for _ in range(8)])
x = torch.randn(512, 576)
ready, done = threading.Event(), threading.Event()
def other():
    if second == "single":
        torch.set_num_threads(1)
    (torch.randn(512, 576) @ torch.randn(576, 576)).sum()
    ready.set()
    done.wait()
for _ in range(5):  # the first thread's team exists first, as the trainer's does before the producer starts
    model(x).sum().backward()
if second != "none":
    thread = threading.Thread(target=other)
    thread.start()
    ready.wait()
started = time.perf_counter()
for _ in range(iterations):
    model(x).sum().backward()
print(time.perf_counter() - started)
done.set()
"""


def measure(variant: str, iterations: int) -> float:
    second, env = VARIANTS[variant]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, second, str(iterations)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.iterations < 1:
        parser.error("--repeats and --iterations must be at least 1")
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            times[variant].append(measure(variant, args.iterations))
    base = statistics.median(times["alone"])
    print(f"{os.cpu_count()} CPUs, {args.repeats} repeats round-robin, {args.iterations} forward+backward each")
    print(f"{'variant':<45} {'median s':>9} {'vs alone':>9}   all")
    for variant, values in times.items():
        median = statistics.median(values)
        print(f"{variant:<45} {median:>9.3f} {median / base:>8.2f}x   {' '.join(f'{v:.3f}' for v in values)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
