"""benchmarks/scoring_share.py's parts: its verifier server holds each request as long as asked and scores with the
``math`` verifier (on loopback, through the ``remote`` verifier), and the shares it reports from a run's rows."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from rlzoo.interfaces import Sample
from rlzoo.registry import default_registry
from rlzoo.rl.scoring import score

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scoring_share as bench  # noqa: E402


def test_the_server_holds_each_request_and_scores_with_math():
    app = bench.slow_verifier_app(0.3)
    server = bench.Server(app)
    try:
        verifier = default_registry().create(
            "verifier", "remote", {"url": f"{server.url}/verify_batch", "batch_size": 2, "cache": False}
        )
        started = time.perf_counter()
        scores = score(verifier, [Sample("2+2=", "4")] * 4, ["4", "5", "The answer is 4", "x"])
        seconds = time.perf_counter() - started
    finally:
        server.stop()
    assert [v.reward for v in scores.verdicts] == [1.0, 0.0, 1.0, 0.0] and scores.errors == 0
    assert (
        seconds >= 0.3 and app.state.requests == 2
    )  # two requests, each held 0.3 s (no upper bound: a loaded machine)
    assert server.server.should_exit and not server.thread.is_alive()


def test_the_shares_of_a_step():
    run = {
        "step_seconds": [2.0, 2.0],
        "rows": [
            {
                "time/rollout": 0.5,
                "time/verify": 1.0,
                "time/train": 0.4,
                "time/prefetch_wait": 0.2,
                "remote/requests": 4,
            },
            {
                "time/rollout": 0.5,
                "time/verify": 1.0,
                "time/train": 0.4,
                "time/prefetch_wait": 0.4,
                "remote/requests": 4,
            },
        ],
    }
    sync, overlap = bench.summarise("sync", run), bench.summarise("overlap", run)
    assert sync["scoring_share"] == overlap["scoring_share"] == pytest.approx(0.5)
    assert sync["exposed_scoring_share"] == pytest.approx(0.5) and sync["wait_for_batch_s"] == pytest.approx(1.5)
    assert overlap["exposed_scoring_share"] == pytest.approx(0.15)  # at most what the step waited for its batch
