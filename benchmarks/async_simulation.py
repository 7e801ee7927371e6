"""What bounded staleness would buy at GPU scale: a discrete-event simulation fed with measured phase times and a
long-tailed response-length distribution, set beside verl's published 2.35-2.67x (docs/async.md).

    python benchmarks/async_simulation.py                                    # verl's published phase times
    python benchmarks/async_simulation.py --measured docs/benchmarks/async_long.json   # rlzoo's, at `long`
    python benchmarks/async_simulation.py --split 16 --split 128        # disaggregated: every G + T split of N

The model, and nothing else (each assumption is a flag):

- a step is a batch of B responses whose lengths are drawn from a log-normal (median ``--median-tokens``, shape
  ``--sigma``) cut at ``--max-tokens``;
- generation on D devices: each device decodes its B/D responses together; an iteration costs
  t_iter(b) = t0 * (1 + b / b_sat) with b the sequences still running, so a device is done when its longest
  response is (the long tail) -- or, with partial rollouts / streaming, its slots are refilled and the batch costs
  its tokens / slots iterations (no tail);
- training on D devices: T_ref * (f + (1 - f) * D_ref / D) with f = ``--train-serial-fraction`` (Amdahl; verl's own
  colocated table implies f ~ 0.83 between 64 and 128 H20s: update_actor 133.4 s vs 113.8 s); the old-log-prob pass
  likewise, skipped where the schedule uses the rollout's log-probs;
- t0 and c are calibrated so that the synchronous colocated schedule on the reference devices reproduces the
  measured phase times exactly; every other schedule is a prediction.

Schedules: ``sync`` (colocated, all N devices generate, then all train); ``async k`` on N/2 + N/2 devices
(rlzoo's ``rollout.max_staleness: k``: batch i starts once the trainer has reached step i - k; a batch waits for its
slowest response); ``stream k`` (as async, with verl's streaming and partial rollouts: no tail; not built in
rlzoo). Prints the predicted speedup over ``sync`` for each device count.

Disaggregated phases (``--split``, issue 48's rollout servers: generation on G devices of its own, training on T):
the same ``async``/``stream`` schedules at ``--k`` on G + T, each against ``sync`` colocated on all G + T devices,
and the split that predicts the most. ``--split G:T`` is one split; ``--split N`` every G = N/8, 2N/8, ..., 7N/8.
``--push-seconds`` adds a weight push to every training step of those schedules (the trainer waits for it; with the
servers' gloo backend it goes through host memory), since colocated engines share the devices and copy in place.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# verl's docs/advance/fully_async.md, Qwen2.5-Math-7B, DAPO, 128 H20, colocated sync: mean seconds per step
VERL_128 = {
    "generate": 177.85,
    "old_logprobs": 53.92,
    "train": 113.81,
    "devices": 128,
    "batch": 512 * 16,
    "published_speedup": "2.35-2.67x (64 + 64 vs 128, staleness 0.5, partial rollouts, 400 steps)",
}


@dataclass
class Costs:
    t0: float  # seconds per decode iteration of one sequence alone
    b_sat: float  # sequences per device at which an iteration costs twice t0
    train: float  # seconds per token on one device (updates)
    old: float  # seconds per token on one device (old-log-prob pass)
    serial: float  # the share of training time on the reference devices that does not shrink with more
    reference: int  # the devices the phase times were measured on


def decode_iterations(lengths: np.ndarray, devices: int, b_sat: float, stream: bool) -> float:
    """Cost of generating ``lengths`` on ``devices`` in units of t0: the slowest device's sum of (1 + b/b_sat)."""
    shares = np.array_split(lengths, devices)
    worst = 0.0
    for share in shares:
        if stream:  # slots refilled: every iteration runs len(share) sequences until the tokens are done
            cost = share.sum() / len(share) * (1 + len(share) / b_sat)
        else:  # b(it) = sequences longer than it: sum over iterations of 1 + b/b_sat
            ordered = np.sort(share)
            cost = ordered[-1] + ordered.sum() / b_sat
        worst = max(worst, float(cost))
    return worst


def phase_times(lengths: np.ndarray, devices: int, costs: Costs, stream: bool, old_pass: bool) -> tuple[float, float]:
    tokens = float(lengths.sum())
    scale = costs.serial + (1 - costs.serial) * costs.reference / devices
    generate = costs.t0 * decode_iterations(lengths, devices, costs.b_sat, stream)
    train = tokens * scale * (costs.train + (costs.old if old_pass else 0.0))
    return generate, train


def sync_time(batches: list[np.ndarray], devices: int, costs: Costs) -> float:
    return sum(sum(phase_times(b, devices, costs, stream=False, old_pass=True)) for b in batches)


def async_time(
    batches: list[np.ndarray],
    gen_devices: int,
    train_devices: int,
    costs: Costs,
    k: int,
    stream: bool,
    old_pass: bool,
    push: float = 0.0,
) -> float:
    """The producer/consumer pipeline of rlzoo.rl.staleness_queue in simulated time: when the last step ends.
    ``push``: seconds each training step spends sending its weights to the generating devices."""
    gen = [phase_times(b, gen_devices, costs, stream, old_pass)[0] for b in batches]
    train = [phase_times(b, train_devices, costs, stream, old_pass)[1] + push for b in batches]
    ready, done = [0.0] * len(batches), [0.0] * len(batches)
    generator_free = 0.0
    for i in range(len(batches)):
        # batch i may start once the trainer has entered step i - k: step i - k - 1 done
        entered = done[i - k - 1] if i - k - 1 >= 0 else 0.0
        ready[i] = max(generator_free, entered) + gen[i]
        generator_free = ready[i]
        done[i] = max(ready[i], done[i - 1] if i else 0.0) + train[i]
    return done[-1]


def parse_split(spec: str) -> list[tuple[int, int]]:
    """``G:T`` -> [(G, T)]; ``N`` -> every (G, N - G) with G a multiple of N/8 (of 1 below 8 devices)."""
    try:
        if ":" in spec:
            g, t = (int(x) for x in spec.split(":"))
            splits = [(g, t)]
        else:
            n = int(spec)
            step = max(1, n // 8)
            splits = [(g, n - g) for g in range(step, n, step)]
    except ValueError:
        raise SystemExit(f"--split {spec!r}: give G:T (devices generating : training) or a total N") from None
    if not splits or min(min(s) for s in splits) < 1:
        raise SystemExit(f"--split {spec!r}: generation and training need a device each at least")
    return splits


def split_rows(batches: list[np.ndarray], splits: list[tuple[int, int]], costs: Costs, k: int, push: float) -> list:
    """Speedup of each disaggregated split over ``sync`` colocated on the same G + T devices, for both schedules
    with and without the old-log-prob pass."""
    rows, base = [], {}
    for g, t in splits:
        n = g + t
        if n not in base:
            base[n] = sync_time(batches, n, costs)
        for mode in ("async", "stream"):
            for old_pass in (True, False):
                time = async_time(batches, g, t, costs, k, mode == "stream", old_pass, push)
                rows.append(
                    {"gen": g, "train": t, "schedule": f"{mode} k={k}", "old_pass": old_pass, "speedup": base[n] / time}
                )
    return rows


def split_table(rows: list[dict]) -> list[str]:
    """Markdown: one line per split, then the best split of each total for each schedule."""
    columns = [(s, o) for s in dict.fromkeys(r["schedule"] for r in rows) for o in (True, False)]
    head = " | ".join(f"{s}, old-log-prob pass {'yes' if o else 'no'}" for s, o in columns)
    lines = [f"| N = G + T | G generate + T train | {head} |", "|---|---|" + "---|" * len(columns)]
    speed = {(r["gen"], r["train"], r["schedule"], r["old_pass"]): r["speedup"] for r in rows}
    for g, t in dict.fromkeys((r["gen"], r["train"]) for r in rows):
        cells = " | ".join(f"{speed[g, t, s, o]:.2f}x" for s, o in columns)
        lines.append(f"| {g + t} | {g} + {t} | {cells} |")
    for n in dict.fromkeys(r["gen"] + r["train"] for r in rows):
        best = []
        for s, o in columns:
            row = max(
                (r for r in rows if r["gen"] + r["train"] == n and (r["schedule"], r["old_pass"]) == (s, o)),
                key=lambda r: r["speedup"],
            )
            best.append(
                f"{s} ({'with' if o else 'without'} old pass) {row['gen']} + {row['train']}: {row['speedup']:.2f}x"
            )
        lines.append(f"best split of {n} devices: " + "; ".join(best))
    return lines


def calibrate(phases: dict, lengths: list[np.ndarray], b_sat: float, serial: float) -> Costs:
    devices = phases["devices"]
    unit_gen = np.mean([decode_iterations(b, devices, b_sat, stream=False) for b in lengths])
    tokens = np.mean([b.sum() for b in lengths])
    return Costs(
        t0=phases["generate"] / unit_gen,
        b_sat=b_sat,
        train=phases["train"] / tokens,
        old=phases["old_logprobs"] / tokens,
        serial=serial,
        reference=devices,
    )


def measured_phases(path: Path) -> dict:
    """The synchronous run's phase times of ``benchmarks/async_throughput.py``'s JSON."""
    result = json.loads(path.read_text())
    phases = result["runs"]["sync"]["phases"]
    return {
        "generate": phases.get("rollout", 0.0) + phases.get("verify", 0.0),
        "old_logprobs": phases.get("old_logprobs", 0.0),
        "train": phases.get("train", 0.0) + phases.get("sync", 0.0),
        "devices": 1,
        "batch": None,
        "published_speedup": None,
        "source": str(path),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, help="async_throughput.py JSON: calibrate on its sync phase times")
    parser.add_argument("--batch", type=int, default=VERL_128["batch"], help="responses per step")
    parser.add_argument("--median-tokens", type=float, default=3000)
    parser.add_argument("--sigma", type=float, default=0.9, help="log-normal shape: the tail's weight")
    parser.add_argument("--max-tokens", type=int, default=28 * 1024)
    parser.add_argument("--b-sat", type=float, default=128.0)
    parser.add_argument("--train-serial-fraction", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--devices", default="16,128", help="total devices N; async splits them N/2 + N/2")
    parser.add_argument(
        "--split",
        action="append",
        default=[],
        metavar="G:T|N",
        help="disaggregated: generation on G devices, training on T (or every split of N), vs sync on G+T",
    )
    parser.add_argument("--k", type=int, default=1, help="--split: the staleness bound (rollout.max_staleness)")
    parser.add_argument("--push-seconds", type=float, default=0.0, help="--split: a weight push per training step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    phases = measured_phases(args.measured) if args.measured else dict(VERL_128, source="verl fully_async.md")
    reference = phases["devices"] if phases["devices"] > 1 else int(args.devices.split(",")[-1])
    phases["devices"] = reference
    lengths = [
        np.minimum(np.ceil(rng.lognormal(np.log(args.median_tokens), args.sigma, args.batch)), args.max_tokens)
        for _ in range(args.steps)
    ]
    costs = calibrate(phases, lengths, args.b_sat, args.train_serial_fraction)
    tail = float(np.mean([b.max() / b.mean() for b in lengths]))
    rows = []
    for n in (int(x) for x in args.devices.split(",")):
        base = sync_time(lengths, n, costs)
        for mode in ("async", "stream"):
            for k in (0, 1, 2, 4):
                for old_pass in (True, False):
                    t = async_time(lengths, n // 2, n - n // 2, costs, k, mode == "stream", old_pass)
                    rows.append({"devices": n, "schedule": f"{mode} k={k}", "old_pass": old_pass, "speedup": base / t})
    print(
        f"phase times ({phases['source']}): generate {phases['generate']:.2f} s, old log-probs "
        f"{phases['old_logprobs']:.2f} s, train {phases['train']:.2f} s on {reference} devices (synchronous)"
    )
    print(
        f"lengths: log-normal median {args.median_tokens:.0f}, sigma {args.sigma}, cut at {args.max_tokens}; "
        f"batch {args.batch}; longest / mean response per batch {tail:.1f}; b_sat {args.b_sat}; "
        f"train serial fraction {args.train_serial_fraction}"
    )
    print("| devices (sync vs gen + train) | schedule | old-log-prob pass | predicted speedup over sync |")
    print("|---|---|---|---|")
    for row in rows:
        n = row["devices"]
        print(
            f"| {n} vs {n // 2} + {n - n // 2} | {row['schedule']} | {'yes' if row['old_pass'] else 'no'} | "
            f"{row['speedup']:.2f}x |"
        )
    splits, split = [split for spec in args.split for split in parse_split(spec)], []
    if splits:
        split = split_rows(lengths, splits, costs, args.k, args.push_seconds)
        print(
            f"\ndisaggregated (generation on G devices, training on T; push {args.push_seconds:g} s per step) "
            "against sync colocated on G + T:"
        )
        print("\n".join(split_table(split)))
    if phases.get("published_speedup"):
        print(f"verl published: {phases['published_speedup']}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "phases": phases,
                    "tail": tail,
                    "rows": rows,
                    "splits": split,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
