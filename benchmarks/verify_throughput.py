"""Code-verifier throughput: responses per second with ``isolation: process`` vs ``isolation: kernel``, one run.

    python benchmarks/verify_throughput.py [--responses 64] [--workers 2] [--rounds 3]

Both verifiers score the same batch of typical responses (correct, wrong, erroring, a little computation) with
``verify_batch``. The rounds alternate process/kernel so that load from other work on the machine hits both
alike; each mode's throughput is its median round. Prints both side by side and the ratio (process / kernel:
how many times slower the kernel sandbox is; the goal is at most 2). Measured numbers belong in
docs/benchmarks.md, not here.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from rlzoo.interfaces import Sample
from rlzoo_verifiers.code import CodeVerifier

SAMPLE = Sample("Write fib(n).", "", meta={"tests": "assert fib(10) == 55\nassert fib(20) == 6765\n"})
RESPONSES = [
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "```python\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n```\n",
    "def fib(n):\n    return n\n",
    "def fib(n):\n    return undefined_name\n",
    "import math\ndef fib(n):\n    p = (1 + math.sqrt(5)) / 2\n    return round(p ** n / math.sqrt(5))\n",
    "def fib(n:\n",
]


def _round(verifier: CodeVerifier, n: int) -> float:
    responses = [RESPONSES[i % len(RESPONSES)] for i in range(n)]
    start = time.perf_counter()
    verdicts = verifier.verify_batch([SAMPLE] * n, responses)
    elapsed = time.perf_counter() - start
    assert sum(v.reward for v in verdicts) > 0, "no response passed: the benchmark is not measuring scoring"
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=64, help="responses per round")
    parser.add_argument("--workers", type=int, default=2, help="the verifier's `workers` (parallel sandboxes)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode, alternating")
    args = parser.parse_args()
    modes = ["process", "kernel"]
    verifiers = {m: CodeVerifier(CodeVerifier.Params(isolation=m, workers=args.workers)) for m in modes}
    for m in modes:  # warm-up: imports, page cache
        _round(verifiers[m], args.workers)
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            rates[m].append(_round(verifiers[m], args.responses))
    median = {m: statistics.median(rates[m]) for m in modes}
    print(
        f"code verifier throughput: {args.responses} responses x {args.rounds} rounds, workers={args.workers}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'isolation':<10} {'responses/s (median)':>21} {'rounds':>24}")
    for m in modes:
        print(f"{m:<10} {median[m]:>21.1f} {' '.join(f'{r:.1f}' for r in rates[m]):>24}")
    print(f"ratio process/kernel: {median['process'] / median['kernel']:.2f}x (goal: at most 2x)")


if __name__ == "__main__":
    main()
