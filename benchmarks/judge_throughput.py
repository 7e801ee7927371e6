"""Scoring throughput of the ``judge`` verifier against its concurrency limit: requests/s with 1, 4, 16 in flight.

    python benchmarks/judge_throughput.py --model-dir models/smollm2-135m-instruct      # starts vLLM on loopback
    python benchmarks/judge_throughput.py --base-url http://127.0.0.1:8001/v1 --model smollm2

Each concurrency scores ``--requests`` distinct responses (no cache) with one judgement each, held to the
``SCORE: n`` format by vLLM's structured outputs, through :func:`rlzoo.rl.scoring.score` as a run does. Writes
one JSON object per concurrency to ``--out``. What it measures is the service's batching under concurrent load,
so the numbers belong to the machine and server they were taken on.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from rlzoo.interfaces import Sample
from rlzoo.registry import default_registry
from rlzoo.rl.scoring import score

RUBRIC = "Is this reply polite? Reply: {response}\nAnswer with one line: SCORE: <0-10>"
FORMAT = {"structured_outputs": {"regex": "SCORE: (10|[0-9])"}}


def measure(base_url: str, model: str, concurrency: int, requests: int, extra_body: dict | None = None) -> dict:
    """Score ``requests`` distinct responses with at most ``concurrency`` judge requests in flight."""
    verifier = default_registry().create(
        "verifier",
        "judge",
        {
            "base_url": base_url,
            "model": model,
            "rubric": RUBRIC,
            "max_tokens": 8,
            "concurrency": concurrency,
            "timeout_s": 600.0,
            "cache": False,
            "extra_body": FORMAT if extra_body is None else extra_body,
        },
    )
    samples = [Sample("Ask them to sit.", "")] * requests
    responses = [f"Please take seat number {i}, thank you." for i in range(requests)]
    started = time.perf_counter()
    scores = score(verifier, samples, responses)
    seconds = time.perf_counter() - started
    metrics = scores.metrics()
    return {
        "concurrency": concurrency,
        "requests": requests,
        "seconds": round(seconds, 3),
        "requests_per_s": round(requests / seconds, 3),
        "errors": scores.errors,
        "latency_p50_s": round(float(metrics.get("judge/latency_p50_s", 0.0)), 3),
        "latency_p95_s": round(float(metrics.get("judge/latency_p95_s", 0.0)), 3),
    }


def start_vllm(model_dir: Path, log: Path, start_s: float = 900) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server for ``model_dir`` on a free loopback port (design.md §9's CPU flags); its API root."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "smollm2",
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        "268435456",
    ]
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + start_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode}; its log: {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.terminate()
            raise SystemExit(f"vLLM did not start within {start_s:g} s; its log: {log}")
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, help="start vLLM serving this model folder")
    parser.add_argument("--base-url", help="an OpenAI-compatible API root already serving --model")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/judge_throughput.json"))
    args = parser.parse_args()
    if (args.model_dir is None) == (args.base_url is None):
        parser.error("give one of --model-dir or --base-url")
    proc = None
    if args.model_dir is not None:
        proc, args.base_url = start_vllm(args.model_dir, Path(tempfile.gettempdir()) / "judge_throughput.vllm.log")
    try:
        rows = [measure(args.base_url, args.model, c, args.requests) for c in args.concurrency]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
