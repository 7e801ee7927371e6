"""``rlzoo train`` in 2 processes with a vLLM engine on every rank (``rollout.per_rank`` with ``vllm``).

Each rank builds its own in-process vLLM engine inside the run's process group (``external_launcher``,
``data_parallel_size`` 1), samples its share of each generation batch and receives its own copy of the
weights after every update. The test checks that both ranks sampled (each rank's log file), that every step logs finite metrics, and
that the rollout log-probs match the trainer's after each weight sync. Routing replay (R3) is not exercised.
Needs vLLM and DeepSpeed (the torch trainer trains in one process only).
"""

from __future__ import annotations

import math
import re

import pytest
from test_multiprocess import finish, launch, write_launch_config

from rlzoo.reporting.console import log_path
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.distributed import Dist

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed==0.19.8)")
pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

STEPS = 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, cold_start_root):
    root = tmp_path_factory.mktemp("vllm-per-rank")
    config = write_launch_config(
        root,
        cold_start_root,
        STEPS,
        "trainer.engine={name: deepspeed, zero_stage: 2}",
        "rollout.engine={name: vllm, kv_cache_memory_bytes: 16777216}",
    )
    finish(launch(2, config, "--set", f"output_dir={root / 'run'}"))
    return root / "run"


def test_both_ranks_sample_with_vllm(run_dir):
    for rank in (0, 1):
        log = log_path(run_dir, rank).read_text()
        shares = re.findall(rf"step (\d+) batch (\d+): rank {rank} samples (\d+) of (\d+) prompts", log)
        assert {int(s) for s, _, _, _ in shares} == set(range(STEPS)), log[-3000:]
        for _, _, mine, total in shares:
            assert int(mine) == Dist(rank=rank, world=2).share_sizes(int(total))[rank]


def test_metrics_are_finite(run_dir):
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isfinite(value) or key.startswith("eval/"), (row["step"], key, value)
    train = [r for r in rows if "reward/mean" in r]
    assert train and all(0 <= r["reward/mean"] <= 1 for r in train)
    assert any(r["train/grad_norm"] > 0 for r in train), train
    # the gathered rollout log-probs (both ranks' engines) agree with the trainer's old log-probs, also after a
    # weight sync: every rank's engine received the update
    diffs = [r["mismatch/abs_logp_diff"] for r in train]
    assert len(diffs) == STEPS and max(diffs) < 1e-4, diffs


@pytest.mark.slow  # hf producers in 2 processes: integration_tests/test_async_multiprocess.py
def test_two_ranks_with_vllm_and_a_producer_each(tmp_path, cold_start_root):
    """``rollout.max_staleness: 2`` with partial rollouts: each rank's vLLM engine samples its share in that rank's
    producer thread (integration_tests/test_async_multiprocess.py has the hf runs); every batch within 2 versions."""
    steps = 3
    config = write_launch_config(
        tmp_path,
        cold_start_root,
        steps,
        "trainer.engine={name: deepspeed, zero_stage: 2}",
        "rollout.engine={name: vllm, kv_cache_memory_bytes: 16777216}",
        "rollout.max_staleness=2",
        "rollout.partial=continue",
    )
    finish(launch(2, config, "--set", f"output_dir={tmp_path / 'run'}"))
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in train] == list(range(steps))
    assert all(0 <= r["rollout/staleness"] <= 2 and math.isfinite(r["loss/policy"]) for r in train), train
    for rank in (0, 1):
        shares = re.findall(rf"step (\d+) batch 0: rank {rank} samples", log_path(tmp_path / "run", rank).read_text())
        assert sorted(map(int, shares)) == list(range(steps)), (rank, shares)
