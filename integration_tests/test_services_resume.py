"""Nothing lost on a kill (issue 49): ``rlzoo train`` scoring through the ``remote`` verifier, SIGKILLed while its
requests are in flight to a real verifier server on 127.0.0.1, then ``--resume``d, ends with the uninterrupted run's
metrics at k = 0 (``rollout.max_staleness: 0``), its reply cache surviving the resume.

The server is rlzoo's own (:func:`rlzoo.services.server.app_for`, what ``rlzoo serve-verifier`` serves) scoring
with the ``math`` verifier, on uvicorn in a thread of this process, each POST held ``DELAY_S`` seconds so that a
step's requests are in flight long enough to be killed in. Which step's they are is known by counting: the runs are
deterministic, so the killed run makes the uninterrupted run's requests in the same order, and the uninterrupted
run's metrics say how many came before step ``KILL_STEP``'s (``remote/requests``, ``eval/remote_requests``).

The keys allowed to differ (:data:`VARIES`), besides ``time/*``: the requests' latencies (wall-clock), and the
requests and cache hits of the steps run again after the checkpoint, whose replies the killed run had cached.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from fastapi import Request
from runs_testlib import REPO, metrics_without_times
from test_resume import rlzoo, write_config

sys.path.append(str(REPO / "tests"))  # the loopback server of the service tests (appended: nothing is shadowed)
from service_testlib import serving  # noqa: E402

from rlzoo.registry import default_registry
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.services.server import app_for

STEPS, KILL_STEP, EVAL_EVERY = 4, 3, 2  # checkpoints after steps 1 and 3 (checkpoint_every 2): resume at step 2
DELAY_S = 0.75
RESPONSES, HELD_OUT = 16, 16  # a step's (4 prompts x 4); an evaluation's (4 prompts x 4 samples: kept small,
# since every POST is held DELAY_S s and the three runs make each evaluation's POSTs)
VARIES = (
    "remote/latency_p50_s",
    "remote/latency_p95_s",
    "eval/remote_latency_p50_s",
    "eval/remote_latency_p95_s",
    "remote/requests",
    "remote/cache_hits",
    "eval/remote_requests",
    "eval/remote_cache_hits",
)


def slow_math_server():
    """rlzoo's verifier server for the ``math`` verifier, each POST held ``DELAY_S`` s; ``state.received`` counts
    the POSTs, ``state.in_flight`` those not yet answered."""
    app = app_for(default_registry().create("verifier", "math", {}))
    app.state.received = app.state.in_flight = 0

    @app.middleware("http")
    async def slow(request: Request, call_next):
        if request.method != "POST":
            return await call_next(request)
        app.state.received += 1
        app.state.in_flight += 1
        try:
            await asyncio.sleep(DELAY_S)
            return await call_next(request)
        finally:
            app.state.in_flight -= 1

    return app


def comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in VARIES} for row in metrics_without_times(rows)]


def requests_before(rows: list[dict], step: int) -> int:
    """The POSTs a run makes before step ``step``'s scoring: the steps' before it and the evaluations' up to it."""
    return int(
        sum(r.get("remote/requests", 0) for r in rows if r["step"] < step)
        + sum(r.get("eval/remote_requests", 0) for r in rows if r["step"] <= step)
    )


@pytest.fixture
def started():
    """The ``rlzoo train`` subprocesses a test starts; any still running at its end (a failed assertion, a timeout)
    is killed by its PID and reaped."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


def test_killed_with_requests_in_flight_resumes_to_the_same_metrics_with_the_cache(tmp_path, cold_start_root, started):
    app = slow_math_server()
    with serving(app) as url:
        verifier = (
            f"verifier={{name: remote, url: '{url}/verify_batch', batch_size: 4, min_reward: 0, "
            "max_reward: 1, retries: 0}"
        )
        config = write_config(
            tmp_path / "run.yaml",
            cold_start_root / "arithmetic",
            [
                f"train.steps={STEPS}",
                f"train.eval_every={EVAL_EVERY}",
                "train.eval_prompts=4",
                "rollout.max_staleness=0",
                verifier,
            ],
        )
        reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
        reference = rlzoo("train", str(config), "--set", f"output_dir={reference_dir}")
        started.append(reference)
        assert reference.wait(timeout=900) == 0, reference.stderr.read().decode()[-3000:]
        expected = read_metrics(reference_dir / "metrics.jsonl")
        before = requests_before(expected, KILL_STEP)

        base = app.state.received
        victim = rlzoo("train", str(config), "--set", f"output_dir={killed_dir}")
        started.append(victim)
        deadline = time.monotonic() + 900
        # step KILL_STEP's requests reached the server and are not answered yet
        while not (app.state.received - base > before and app.state.in_flight > 0):
            assert victim.poll() is None, (
                f"the run ended before it could be killed: {victim.stderr.read().decode()[-3000:]}"
            )
            assert time.monotonic() < deadline, "timed out waiting for the requests of the step to kill in"
            time.sleep(0.005)
        in_flight = app.state.in_flight
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(timeout=60) == -signal.SIGKILL and in_flight > 0
        killed = read_metrics(killed_dir / "metrics.jsonl")
        assert [r["step"] for r in killed if "reward/mean" in r] == list(range(KILL_STEP))  # killed in step 3
        cached = (killed_dir / "service_cache.sqlite").stat().st_size

        resumed = rlzoo("train", str(config), "--resume", str(killed_dir))
        started.append(resumed)
        assert resumed.wait(timeout=900) == 0, resumed.stderr.read().decode()[-3000:]

    actual = read_metrics(killed_dir / "metrics.jsonl")
    assert [r["step"] for r in actual] == [r["step"] for r in expected] == list(range(STEPS + 1))
    assert any(r.get("reward/mean", 0) > 0 for r in expected)  # the rewards the service gave are not all alike
    assert comparable(actual) == comparable(expected)
    # the cache survived the resume: step 2 (after the checkpoint) and its evaluation were scored before the kill,
    # so the resumed run asked for none of them; step 3's requests, in flight at the kill, were asked again
    assert (killed_dir / "service_cache.sqlite").stat().st_size >= cached > 0
    redone = {r["step"]: r for r in actual}
    assert redone[2]["remote/requests"] == 0 and redone[2]["remote/cache_hits"] == RESPONSES
    assert redone[2]["eval/remote_requests"] == 0 and redone[2]["eval/remote_cache_hits"] == HELD_OUT
    assert redone[3]["remote/requests"] > 0
    # and the keys that do differ are only those: the same counts, apart from the steps run again
    for row, ref in zip(actual, expected, strict=True):
        if row["step"] not in (2, 3):
            assert {k: row.get(k) for k in VARIES if "latency" not in k} == {
                k: ref.get(k) for k in VARIES if "latency" not in k
            }
