"""benchmarks/judge_throughput.py's measurement against the test's own OpenAI-compatible judge on loopback: every
response scored, and more requests in flight finish a batch of slow judgements sooner."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from fastapi import FastAPI, Request
from service_testlib import serving

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import judge_throughput as bench  # noqa: E402

# long enough that the client's own overhead on a loaded machine (~0.5 s seen for 8 requests) stays small beside it
JUDGEMENT_S = 0.5


def slow_judge() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        assert body["structured_outputs"] == bench.FORMAT["structured_outputs"]
        await asyncio.sleep(JUDGEMENT_S)
        return {
            "choices": [{"message": {"content": "SCORE: 7"}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 3},
        }

    return app


def test_more_in_flight_scores_a_batch_of_slow_judgements_sooner():
    with serving(slow_judge()) as url:
        one, four = (bench.measure(f"{url}/v1", "fake", c, 8) for c in (1, 4))
    assert (one["errors"], four["errors"]) == (0, 0) and one["requests"] == four["requests"] == 8
    assert one["seconds"] >= 8 * JUDGEMENT_S and four["seconds"] < one["seconds"] / 2
    assert four["requests_per_s"] > 2 * one["requests_per_s"] and one["latency_p50_s"] >= JUDGEMENT_S
