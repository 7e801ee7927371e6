"""Micro-batches over two processes (torchrun, gloo): the gradient of a minibatch split over both ranks, each rank in
several micro-batches (and a different number of them), equals one forward per rank: to 1e-6 in float64 for every
aggregation and the batch-level clippers, and to float32 precision through DeepSpeed's own accumulation at ZeRO 0
and 2. The single-process cases are in tests/test_micro_batches.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from rlzoo.config.schema import TinyModelConfig
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model  # noqa: E402

HELPER = Path(__file__).with_name("ds_micro_batches.py")
OBJECTIVES = {
    "token-mean": {"aggregation": {"name": "token-mean"}},
    "seq-mean-token-mean": {"aggregation": {"name": "seq-mean-token-mean"}},
    "seq-mean-token-sum": {"aggregation": {"name": "seq-mean-token-sum"}},
    "seq-mean-token-sum-norm": {"aggregation": {"name": "seq-mean-token-sum-norm"}},
    "sequence-ratio": {"ratio": {"name": "sequence"}, "clipper": {"name": "ppo", "eps_low": 0.01, "eps_high": 0.01}},
    "kl-cov": {"clipper": {"name": "kl-cov", "select_fraction": 0.2}},
    "gmpo": {"clipper": {"name": "gmpo"}},
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("micro_two")
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(architecture="qwen3", hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, root / "model")
    launcher_owned = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher_owned}
    env["OMP_NUM_THREADS"] = "1"
    # a second try on a fresh port: the port is chosen free, then bound by torchrun, and once in the full suite
    # (vLLM servers starting in the other process) the run failed there and passed alone; a real fault fails twice
    for _ in range(2):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(_free_port()),
            str(HELPER),
            str(root / "model"),
            str(root),
            json.dumps(OBJECTIVES),
        ]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if result.returncode == 0:
            break
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    return root


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_two_processes_in_micro_batches_match_one_forward_per_rank(results, name):
    record = json.loads((results / f"{name}-torch-float64.json").read_text())
    assert record["micro_batches"][0] == 1 and record["micro_batches"][1] >= 3
    assert record["same_keys"]
    assert abs(record["loss_one"] - record["loss_many"]) < 1e-6
    assert record["max_grad"] > 1e-4 and record["max_grad_gap"] < 1e-6


@pytest.mark.parametrize("engine", ["deepspeed-zero0", "deepspeed-zero2"])
@pytest.mark.parametrize("name", ["token-mean", "kl-cov"])
def test_deepspeed_accumulates_micro_batches_as_one_forward(results, name, engine):
    """DeepSpeed's own accumulation (the boundary at the last micro-batch, reduction then), in float32."""
    record = json.loads((results / f"{name}-{engine}.json").read_text())
    assert record["micro_batches"][0] == 1 and record["micro_batches"][1] >= 3
    assert abs(record["loss_one"] - record["loss_many"]) < 1e-5
    assert record["max_grad_gap"] <= 1e-5 * record["max_grad"] + 1e-7
