"""The share of an RL step that scoring by a remote verifier takes, with and without overlap, side by side in one run.

    python benchmarks/scoring_share.py [--latency-s 0.5] [--steps 12] [--warmup 2] [--settings sync,overlap]
                                       [--set KEY=VALUE ...] [--out docs/benchmarks/scoring_share.json]

A real verifier server runs on 127.0.0.1 in this process (rlzoo's own, :func:`rlzoo.services.server.app_for`, what
``rlzoo serve-verifier`` serves, scoring with the ``math`` verifier), every POST held ``--latency-s`` seconds: the
artificial latency of a remote judge or sandbox. Each setting is one ``rlzoo train`` of the README main job
(``examples/gspo_tiny_moe.yaml`` on the in-process engines, hf + torch, 4 prompts x 4 responses a step, as the
integration tests run it) scoring through the ``remote`` verifier (``batch_size`` 4: 4 requests a step, all in
flight at once; no cache, so every step asks), from the same cold start, one after another. Settings: ``sync``
(each batch sampled and scored at the start of its step), ``overlap`` (``rollout.overlap: 1``: step t+1's batch
sampled and scored while step t trains, docs/overlap.md), or a staleness bound ``k`` (``rollout.max_staleness``).
The settings take turns, ``--repeats`` times (sync, overlap, sync, overlap, ...), so that a shared machine whose
load drifts weighs on each; the table shows the medians over a setting's runs, and each run's numbers below it.

Every run gets ``OMP_WAIT_POLICY=PASSIVE`` (``--omp-wait-policy``): on the loaded 2-core machine (far more
runnable threads than cores), libgomp's default spinning made the synchronous loop's training phase 20x slower
(3.17 s against 0.155 s a step) and its steps 7x slower than the same work in an overlapped run, whose second
OpenMP team makes libgomp spin less (docs/benchmarks.md, "Scoring by a service"): a difference between the
settings that has nothing to do with scoring. Passive waiting takes it out of the comparison.

A step's wall time is the interval between consecutive ``metrics.jsonl`` lines (the first ``--warmup`` steps
dropped, and the last one: with overlap nothing is left to sample then). Per setting: ``time/verify`` (scoring,
in the background with overlap), its share of the step's wall time, and the part of the step the trainer waited
for its batch (``time/prefetch_wait`` with overlap, ``time/rollout_wait`` with k, all of ``time/rollout`` +
``time/verify`` in sync); ``exposed_scoring_share`` is the wall-time share in which the trainer could have been
waiting on scoring: all of ``time/verify`` in sync, at most ``min(time/verify, wait)`` with overlap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import ROOT, log_tail, run_measured  # benchmarks/ is the script's directory, first on sys.path
from async_throughput import overrides_for

CONFIG = ROOT / "examples" / "gspo_tiny_moe.yaml"
BASE = [  # the integration tests' FAST job, without its evaluations and checkpoints in the timed steps
    "rollout.engine={name: hf}",
    "trainer.engine={name: torch}",
    "cold_start.steps=40",
    "cold_start.batch_size=16",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "train.eval_prompts=8",
    "train.eval_samples_per_prompt=1",
]


def slow_verifier_app(latency_s: float) -> Any:
    """rlzoo's verifier server for ``math``, each POST held ``latency_s`` seconds before it is scored."""
    from fastapi import Request

    from rlzoo.registry import default_registry
    from rlzoo.services.server import app_for

    app = app_for(default_registry().create("verifier", "math", {}))
    app.state.requests = 0

    @app.middleware("http")
    async def slow(request: Request, call_next):
        if request.method == "POST":
            app.state.requests += 1
            await asyncio.sleep(latency_s)
        return await call_next(request)

    return app


class Server:
    """uvicorn serving ``app`` on a free port of 127.0.0.1 in a thread, until :meth:`stop`."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, name="verifier-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SystemExit("the verifier server did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def train_once(args: argparse.Namespace, setting: str, url: str, cold_start: Path, repeat: int) -> dict[str, Any]:
    out = args.work / f"{setting}-{repeat}"
    shutil.rmtree(out, ignore_errors=True)
    steps = args.steps
    sets = [
        *BASE,
        f"output_dir={out}",
        f"cold_start.output_dir={cold_start}",
        f"train.steps={steps}",
        f"train.eval_every={steps + 1}",
        f"train.checkpoint_every={steps}",
        f"verifier={{name: remote, url: '{url}/verify_batch', batch_size: 4, cache: false, retries: 0}}",
        *args.set,
        *overrides_for(setting),
    ]
    command = [sys.executable, "-m", "rlzoo.cli", "train", str(CONFIG), *[x for s in sets for x in ("--set", s)]]
    env = {"OMP_WAIT_POLICY": args.omp_wait_policy} if args.omp_wait_policy else {}
    measured = run_measured(command, out / "bench.log", watch=out / "metrics.jsonl", env=env)
    if measured.returncode != 0:
        return {"status": "failed", "log": str(measured.log), "error": log_tail(measured.log, 1500)}
    timed = [(t, row) for t, row in measured.line_times if "reward/mean" in row and "final" not in row]
    kept = range(max(args.warmup, 1), len(timed) - 1)
    return {
        "status": "ok",
        "step_seconds": [timed[k][0] - timed[k - 1][0] for k in kept],
        "rows": [timed[k][1] for k in kept],
        "log": str(measured.log),
    }


def summarise(setting: str, run: dict[str, Any]) -> dict[str, Any]:
    """Means over the timed steps; see the module docstring."""
    rows, wall = run["rows"], statistics.mean(run["step_seconds"])

    def mean(key: str) -> float:
        return statistics.mean(row.get(key, 0.0) for row in rows)

    verify = mean("time/verify")
    if setting == "sync":
        wait = mean("time/rollout") + verify
    else:
        wait = mean("time/prefetch_wait") if setting == "overlap" else mean("time/rollout_wait")
    exposed = verify if setting == "sync" else min(verify, wait)
    return {
        "steps_timed": len(rows),
        "seconds_per_step": wall,
        "verify_s": verify,
        "rollout_s": mean("time/rollout"),
        "train_s": mean("time/train"),
        "wait_for_batch_s": wait,
        "scoring_share": verify / wall,
        "exposed_scoring_share": exposed / wall,
        "requests_per_step": mean("remote/requests"),
        "latency_p50_s": mean("remote/latency_p50_s"),
        "reward_mean": mean("reward/mean"),
    }


def report(result: dict[str, Any]) -> str:
    settings = list(result["summary"])
    first = settings[0] if settings else None
    lines = [
        f"remote verifier latency {result['latency_s']:g} s a request; {result['steps']} steps, "
        f"{result['warmup']} warm-up and the last dropped; medians of {result['repeats']} runs a setting; "
        f"OMP_WAIT_POLICY {result.get('omp_wait_policy') or 'unset'}",
        "| | " + " | ".join(settings) + (f" | ratio to {first}" * (len(settings) > 1) if first else "") + " |",
        "|---|" + "---|" * (len(settings) + (len(settings) > 1)),
    ]
    names = [
        ("seconds_per_step", "s/step (wall)"),
        ("verify_s", "time/verify (s)"),
        ("wait_for_batch_s", "waited for the batch (s)"),
        ("scoring_share", "scoring / step"),
        ("exposed_scoring_share", "scoring the step waited on / step"),
        ("train_s", "time/train (s)"),
        ("requests_per_step", "requests / step"),
        ("latency_p50_s", "request latency p50 (s)"),
    ]
    for key, label in names:
        values = [result["summary"][s][key] for s in settings]
        cells = [f"{v:.3f}" for v in values]
        if len(settings) > 1:
            cells.append(" / ".join(f"{v / values[0]:.2f}" if values[0] else "-" for v in values[1:]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for s, done in result["runs"].items():
        for run in done:
            if run["status"] != "ok":
                lines.append(f"{s}: failed (log {run['log']}): {run['error'][-300:]}")
    for s, done in result["per_run"].items():
        lines.append(
            f"{s}, each run: "
            + "; ".join(
                f"{one['seconds_per_step']:.3f} s/step, scoring {one['scoring_share']:.3f} of it, waited on "
                f"{one['exposed_scoring_share']:.3f}"
                for one in done
            )
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-s", type=float, default=0.5, help="seconds the server holds every request")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--settings", default="sync,overlap", help="sync, overlap, or a staleness bound k, comma-separated"
    )
    parser.add_argument(
        "--omp-wait-policy",
        default="PASSIVE",
        help="OMP_WAIT_POLICY of every run ('' leaves libgomp's default; see the module docstring)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs of each setting, the settings taking turns")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every setting's config")
    parser.add_argument("--work", type=Path, default=None, help="run folders (default: a temporary folder, removed)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "scoring_share.json")
    args = parser.parse_args(argv)
    settings = args.settings.split(",")
    load_before = os.getloadavg()
    temporary = args.work is None
    args.work = Path(tempfile.mkdtemp(prefix="scoring_share-")) if temporary else args.work
    server = Server(slow_verifier_app(args.latency_s))
    try:
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
        for repeat in range(args.repeats):  # taking turns: a machine whose load drifts weighs on every setting
            for s in settings:
                runs[s].append(train_once(args, s, server.url, args.work / "cold_start", repeat))
    finally:
        server.stop()
        if temporary:
            shutil.rmtree(args.work, ignore_errors=True)
    result = {
        "latency_s": args.latency_s,
        "steps": args.steps,
        "warmup": args.warmup,
        "settings": settings,
        "repeats": args.repeats,
        "omp_wait_policy": args.omp_wait_policy or None,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_before": load_before},
        "runs": {s: [{k: v for k, v in run.items() if k != "rows"} for run in done] for s, done in runs.items()},
        "per_run": {s: [summarise(s, run) for run in done if run["status"] == "ok"] for s, done in runs.items()},
    }
    result["summary"] = {
        s: {key: statistics.median(one[key] for one in done) for key in done[0]}
        for s, done in result["per_run"].items()
        if done
    }
    result["machine"]["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(report(result))
    return 0 if all(run["status"] == "ok" for done in runs.values() for run in done) else 1


if __name__ == "__main__":
    sys.exit(main())
