"""``rlzoo train`` in 2 processes with rollouts on every rank (``rollout.per_rank``, the default with ``hf``).

The config of test_multiprocess.py (4 prompts x 4 responses, 2 minibatches, 1-digit sums, DeepSpeed ZeRO-2) with
dynamic sampling, so steps also draw further generation batches, which are split over the ranks too. Each rank
samples its share of each generation batch with its own engine and seed, so the samples differ from the
1-process run's (their expected values do not): the test checks that both ranks sampled (each rank's log file),
that every step logs the 1-process run's metric keys with finite values, and that the evaluation before any
update, which does not depend on the samples, is identical. That the gathered batch is the one a single engine
gives for the same generations is checked exactly in tests/test_rollout_shares.py.

The rollout time of the two processes is printed (``-s``), not asserted: the machine is shared; the measured
numbers are in docs/distributed.md.
"""

from __future__ import annotations

import math
import re
import statistics

import pytest
from test_multiprocess import finish, launch, write_launch_config

from rlzoo.reporting.console import log_path
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.distributed import Dist

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed==0.19.8)")

# slow (~45 s, a 1-process and a 2-process run): by default two ranks sample their shares with hf in
# test_async_multiprocess.py::test_k2_partial_under_zero3_stays_within_two_versions, with vLLM in
# test_vllm_per_rank.py, and the dynamic-sampling batches' split over ranks in tests/test_rollout_shares.py
pytestmark = pytest.mark.slow

STEPS = 3
ZERO2 = "trainer.engine={name: deepspeed, zero_stage: 2}"
FILTER = "algorithm.batch_filter={name: dynamic-sampling, max_gen_batches: 3}"


@pytest.fixture(scope="module")
def config_file(tmp_path_factory, cold_start_root):
    return write_launch_config(tmp_path_factory.mktemp("per-rank"), cold_start_root, STEPS, ZERO2, FILTER)


@pytest.fixture(scope="module")
def runs(config_file, tmp_path_factory):
    out = {}
    for processes in (1, 2):
        run_dir = tmp_path_factory.mktemp(f"per-rank-{processes}p")
        finish(launch(processes, config_file, "--set", f"output_dir={run_dir}"))
        out[processes] = run_dir
    return out


def test_both_ranks_sample_their_share(runs):
    run_dir = runs[2]
    for rank in (0, 1):
        log = log_path(run_dir, rank).read_text()
        shares = re.findall(rf"step (\d+) batch (\d+): rank {rank} samples (\d+) of (\d+) prompts", log)
        assert {int(s) for s, _, _, _ in shares} == set(range(STEPS)), log[-3000:]
        for _, batch, mine, total in shares:
            assert int(mine) == Dist(rank=rank, world=2).share_sizes(int(total))[rank], (batch, mine, total)
        assert shares[0] == ("0", "0", "2", "4")  # the first batch of step 0: 2 of the 4 prompts each


def test_metrics_keep_their_keys_and_stay_finite(runs):
    one, two = read_metrics(runs[1] / "metrics.jsonl"), read_metrics(runs[2] / "metrics.jsonl")
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(STEPS + 1))
    for a, b in zip(one, two):
        assert sorted(a) == sorted(b), (a["step"], set(a) ^ set(b))
        for key, value in b.items():
            if not (isinstance(a[key], float) and math.isnan(a[key])):
                assert math.isfinite(value), (b["step"], key, value)
    assert {k: v for k, v in one[0].items() if k.startswith("eval/")} == {
        k: v for k, v in two[0].items() if k.startswith("eval/")
    }  # evaluated by rank 0 before any update: the same weights, the same seed
    train = [r for r in two if "reward/mean" in r]
    assert all(0 <= r["reward/mean"] <= 1 and r["filter/gen_batches"] >= 1 for r in train)
    assert any(r["train/grad_norm"] > 0 for r in train), train
    for processes, rows in ((1, one), (2, two)):
        times = [r["time/rollout"] for r in rows if "time/rollout" in r]
        print(f"{processes} process(es): median time/rollout {statistics.median(times):.3f} s over {len(times)} steps")
