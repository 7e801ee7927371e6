"""``rlzoo train`` in 2 processes (``torchrun``, gloo on CPU) logs the same metrics as in 1 process.

The main example config, shrunk (4 prompts x 4 responses, 2 minibatches, 4 steps, 1-digit sums so that most
steps have non-zero rewards and gradients), with the DeepSpeed training engine. Rank 0 samples everything
(``rollout.per_rank: false``) with the same seeds, so the rollout metrics must be identical; the training metrics may differ by float rounding only (each
rank's forward covers its half of a minibatch, and the gradients are summed across ranks).

Measured on the 2-core CPU machine, largest |1 process - 2 processes| over all steps:

=========================  =============  ================  ==================
metric                     ZeRO-2 (GSPO)  DS-MoE ep_size 2  ZeRO-2, token-mean
=========================  =============  ================  ==================
reward/*, response/*, eval 0              0                 0
loss/policy, loss/total    1.5e-8         7.5e-9            7.5e-9
ratio/min, max, mean       2.4e-7         4.8e-7            2.4e-7
clip/*, moe/*flip_rate     0              0                 0
train/grad_norm            8.9e-8         2.1e-7            1.5e-6
mismatch/*, kl/*           2.8e-8         6.0e-8            3.5e-8
train/aux_loss (relative)  1.2e-2         1.2e-2            1.2e-2
=========================  =============  ================  ==================

``train/aux_loss`` is the router load-balancing loss of each rank's own rows, averaged over ranks, which is not
the loss of the whole minibatch (it is not linear in the tokens); hence its own tolerance. Discrete metrics
(clip fractions, flip rates) would move by a whole token if a value sat within ~1e-7 of a threshold; none did.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from runs_testlib import EXAMPLE, FAST, launcher_env, metrics_without_times, torchrun

from rlzoo.config.loading import apply_overrides, read_yaml
from rlzoo.reporting.metrics_log import read_metrics

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed==0.19.8)")

STEPS = 4
TRAIN_TOL = 1e-4  # absolute, for every training metric (losses, ratios, clip fractions, KL, grad norm, mismatch)
MOE_TOL = 1e-2  # flip rates: a router tie within float rounding would flip a few of ~500 slots (measured: 0)
AUX_RTOL = 5e-2  # train/aux_loss: a mean of per-rank losses (measured 1.1e-2 relative)
EXACT = ("reward/", "response/", "advantage/", "verifier/", "eval/", "train/nonfinite_steps", "final", "step")
TIMEOUT = 300

ZERO2 = "trainer.engine={name: deepspeed, zero_stage: 2}"
EP2 = "trainer.engine={name: deepspeed, zero_stage: 2, moe: deepspeed, ep_size: 2}"
RUNS = {
    # name: (overrides of both runs, extra overrides of the 1-process run)
    "zero2": ([ZERO2], []),
    "moe-ep2": ([EP2], ["trainer.engine.ep_size=1"]),
    "zero2-token-mean": ([ZERO2, "algorithm.aggregation={name: token-mean}"], []),
    # a critic trains in the same processes as the policy: its values, returns and updates split the same way
    "ppo-zero2": ([ZERO2, "algorithm.preset=ppo"], []),
}


def write_launch_config(folder: Path, cold_start_root: Path, steps: int, *overrides: str) -> Path:
    """The launched tests' config in ``folder``: the main example shrunk (``FAST``), 1-digit sums so most steps
    have non-zero rewards and gradients, 2 minibatches, one shared cold start, then ``overrides``."""
    data = apply_overrides(
        read_yaml(EXAMPLE),
        [
            *FAST,
            "task.digits=1",
            "cold_start.steps=100",
            f"cold_start.output_dir={cold_start_root / 'arithmetic-1digit'}",
            f"train.steps={steps}",
            "algorithm.minibatches_per_rollout=2",
            *overrides,
        ],
    )
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def config_file(tmp_path_factory, cold_start_root) -> Path:
    # rank 0 samples with the 1-process seeds (per-rank: test_per_rank_rollout.py)
    return write_launch_config(
        tmp_path_factory.mktemp("multiprocess"), cold_start_root, STEPS, "rollout.per_rank=false"
    )


def launch(processes: int, config: Path, *args: str) -> subprocess.Popen:
    env = launcher_env()
    if processes == 1:
        command = [sys.executable, "-m", "rlzoo.cli", "train", str(config), *args]
    else:
        command = torchrun(processes, "-m", "rlzoo.cli", "train", str(config), *args)
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _descendants(pid: int) -> list[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [d for c in map(int, children) for d in (c, *_descendants(c))]


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and its workers (torchrun starts each worker in a session of its own)."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)


def kill_once_latest_is(victim: subprocess.Popen, run_dir: Path, checkpoint: str) -> None:
    """SIGKILL the launcher and its ranks once ``run_dir``'s latest checkpoint is ``checkpoint``."""
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + TIMEOUT
    try:
        while not (latest.is_file() and latest.read_text().strip() == checkpoint):
            assert victim.poll() is None, f"the run ended before it could be killed: {victim.stderr.read()[-3000:]}"
            assert time.time() < deadline
            time.sleep(0.02)
    finally:
        kill_tree(victim)


def finish(proc: subprocess.Popen) -> None:
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise
    assert proc.returncode == 0, err[-6000:]


_done: dict[tuple[str, int], Path] = {}


@pytest.fixture(scope="module")
def run(config_file, tmp_path_factory):
    """``run(name, processes)``: the run folder of that configuration, trained once per module."""

    def get(name: str, processes: int) -> Path:
        if (name, processes) not in _done:
            run_dir = tmp_path_factory.mktemp(f"{name}-{processes}p")
            common, single = RUNS[name]
            overrides = [*common, *(single if processes == 1 else []), f"output_dir={run_dir}"]
            finish(launch(processes, config_file, *[a for o in overrides for a in ("--set", o)]))
            _done[name, processes] = run_dir
        return _done[name, processes]

    return get


#: how each rank cut its share into micro-batches: a fact of the split, not of the training
LAYOUT = ("train/padding_fraction", "train/micro_batches", "critic/padding_fraction", "critic/micro_batches")
AUX = ("train/aux_loss", "critic/aux_loss")  # per-rank router losses, averaged over ranks


def assert_same_metrics(one: Path, two: Path) -> None:
    rows1, rows2 = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [r["step"] for r in rows1] == [r["step"] for r in rows2] == list(range(STEPS + 1))
    for a, b in zip(rows1, rows2):
        assert sorted(a) == sorted(b), (a["step"], set(a) ^ set(b))
        # a critic's values come from its own data-parallel training: advantages then agree to TRAIN_TOL only
        exact = EXACT if "critic/vf_loss" not in a else tuple(k for k in EXACT if k != "advantage/")
        for key, expected in a.items():
            got = b[key]
            where = f"step {a['step']} {key}: 1 process {expected!r}, 2 processes {got!r}"
            if key.startswith("time/") or key in LAYOUT:
                continue
            if key.startswith(exact):
                assert got == expected, where
            elif key in AUX:
                assert got == pytest.approx(expected, rel=AUX_RTOL), where
            elif isinstance(expected, float) and math.isnan(expected):
                assert math.isnan(got), where
            else:
                assert abs(got - expected) <= (MOE_TOL if key.startswith("moe/") else TRAIN_TOL), where
    train = [r for r in rows1 if "reward/mean" in r]
    assert any(r["reward/mean"] > 0 for r in train) and any(r["train/grad_norm"] > 0 for r in train), train


# by default moe-ep2 (2 processes of ZeRO-2 with DeepSpeed-MoE experts split over them, against 1 process); zero2,
# the aggregation and the critic variants in the slow suite: the same 2-process CLI path, and plain ZeRO-2 over two
# processes against one by default in test_deepspeed_engine.py::test_two_processes_match_one[zero2]
@pytest.mark.parametrize("name", [n if n == "moe-ep2" else pytest.param(n, marks=pytest.mark.slow) for n in RUNS])
def test_two_processes_log_the_metrics_of_one(name, run):
    assert_same_metrics(run(name, 1), run(name, 2))


@pytest.mark.slow  # the default suite kills one rank and resumes (below)
def test_a_killed_two_process_run_resumes_exactly(config_file, run, tmp_path):
    reference = run("zero2", 2)
    killed_dir = tmp_path / "killed"
    victim = launch(2, config_file, "--set", ZERO2, "--set", f"output_dir={killed_dir}")
    kill_once_latest_is(victim, killed_dir, "step_000002")
    assert victim.returncode == -signal.SIGKILL
    checkpoint = killed_dir / "checkpoints" / "step_000002"
    assert sorted(p.name for p in (checkpoint / "optimizer").iterdir()) == ["rank00000", "rank00001"]
    assert len([r for r in read_metrics(killed_dir / "metrics.jsonl") if "reward/mean" in r]) < STEPS

    finish(launch(2, config_file, "--set", ZERO2, "--resume", str(killed_dir)))
    expected = metrics_without_times(read_metrics(reference / "metrics.jsonl"))
    actual = metrics_without_times(read_metrics(killed_dir / "metrics.jsonl"))
    assert [r["step"] for r in actual] == list(range(STEPS + 1))
    assert actual == expected


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    for pid in _descendants(launcher.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"-m" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no process of rank {rank} under the launcher")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_a_run_killed_on_one_rank_stops_and_resumes_exactly(config_file, run, tmp_path, monkeypatch):
    """SIGKILL to rank 1 alone, at a seeded random moment after the first checkpoint (or, if that comes first,
    while rank 0 is writing the second, held there by the RLZOO_TEST_CHECKPOINT_PAUSE hook): the launcher ends
    rank 0 within a minute (a rank stuck at a collective would give up after RLZOO_DIST_TIMEOUT_S), the first
    checkpoint is the latest, and the resumed run logs the uninterrupted run's metrics. The run is moe-ep2's
    (each rank holds half the experts and their optimizer state), so the uninterrupted run is the one
    test_two_processes_log_the_metrics_of_one already trained."""
    from rlzoo.runtime.checkpoint.store import PAUSE_ENV

    reference = run("moe-ep2", 2)
    marker = tmp_path / "half-written"
    monkeypatch.setenv("RLZOO_DIST_TIMEOUT_S", "120")
    monkeypatch.setenv(PAUSE_ENV, str(marker))
    killed_dir = tmp_path / "killed"
    victim = launch(2, config_file, "--set", EP2, "--set", f"output_dir={killed_dir}")
    deadline = time.time() + TIMEOUT
    try:
        while not marker.exists():  # the first checkpoint, let through
            assert victim.poll() is None, f"the run ended before it could be killed: {victim.stderr.read()[-3000:]}"
            assert time.time() < deadline
            time.sleep(0.02)
        marker.unlink()
        moment = time.time() + random.Random(5).uniform(0.0, 2.0)  # in step 2 or 3: sampling, a collective, ...
        while time.time() < moment and not marker.exists():
            time.sleep(0.01)
        survivor = _rank_pid(victim, 0)
        os.kill(_rank_pid(victim, 1), signal.SIGKILL)
        victim.wait(timeout=90)
        assert victim.returncode != 0
        assert not _alive(survivor), "rank 0 outlived its launcher"
    finally:
        if victim.poll() is None:
            kill_tree(victim)
    assert (killed_dir / "checkpoints" / "latest").read_text().strip() == "step_000002"

    monkeypatch.delenv(PAUSE_ENV)
    finish(launch(2, config_file, "--set", EP2, "--resume", str(killed_dir)))
    expected = metrics_without_times(read_metrics(reference / "metrics.jsonl"))
    actual = metrics_without_times(read_metrics(killed_dir / "metrics.jsonl"))
    assert [r["step"] for r in actual] == list(range(STEPS + 1))
    assert actual == expected
