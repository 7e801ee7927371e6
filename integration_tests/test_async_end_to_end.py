"""``rollout.max_staleness`` end to end (rlzoo.rl.async_rollouts): runs train with finite metrics and every batch at
most k versions stale, on the in-process engines with a critic, LoRA adapters, Routing Replay R3 and multi-turn
episodes with a tool, and on vLLM + DeepSpeed; a run resumed from a checkpoint trains every step once, its first
batch sampled afresh by the checkpoint's weights."""

from __future__ import annotations

import pytest
from runs_testlib import assert_finite_metrics, make_config, metrics_without_times

from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.run import train

TOOLS = [
    "task={name: calculator-arithmetic, digits: 3, operations: ['*'], tool_demonstrations: 0.5}",
    "episode={environment: {name: tools}, tools: [{name: calculator}], tool_parser: {name: hermes}, "
    "max_turns: 2, max_tokens: 200}",
    "rollout.max_new_tokens=48",
]


def _train_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "reward/mean" in r]


def _staleness(rows: list[dict]) -> list[float]:
    return [r["rollout/staleness"] for r in _train_rows(rows)]


def test_async_trains_end_to_end_and_resumes(tmp_path, cold_start_root):
    run_dir = tmp_path / "run"
    overrides = ("rollout.max_staleness=2", "train.checkpoint_every=2")
    train(make_config(run_dir, cold_start_root, *overrides, "train.steps=4"), progress=False)
    rows = _train_rows(assert_finite_metrics(run_dir, 4))
    assert all(0 <= s <= 2 for s in _staleness(rows)) and max(_staleness(rows)) > 0

    train(make_config(run_dir, cold_start_root, *overrides, "train.steps=6"), resume=run_dir, progress=False)
    resumed = _train_rows(assert_finite_metrics(run_dir, 6))  # every step once, in order
    assert resumed[:4] == rows  # the steps before the checkpoint are kept as they were
    assert _staleness(resumed)[4] == 0.0  # the queue is not checkpointed: the first batch is sampled afresh
    assert all(0 <= s <= 2 for s in _staleness(resumed))


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("critic", ["algorithm.preset=ppo"]),
        ("lora", ["model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}"]),
        ("r3", ["algorithm.router={name: replay-rollout}"]),
        ("decoupled", ["algorithm.correction={name: tis, level: token, action: mask, threshold: 5.0}"]),
        ("partial-continue", ["rollout.partial=continue", "algorithm.router=null"]),
        ("partial-restart", ["rollout.partial=restart", "algorithm.router=null"]),
        pytest.param(  # slow: its two parts run by default in the r3 and partial-continue cases above
            "partial-r3",
            ["rollout.partial=continue", "algorithm.router={name: replay-rollout}"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_async_runs_with_each_component(tmp_path, cold_start_root, name, overrides):
    run_dir = tmp_path / name
    train(make_config(run_dir, cold_start_root, "rollout.max_staleness=2", *overrides), progress=False)
    rows = assert_finite_metrics(run_dir, 3)
    assert all(0 <= s <= 2 for s in _staleness(rows)) and max(_staleness(rows)) > 0
    train_rows = _train_rows(rows)
    if name == "critic":
        assert all("critic/vf_loss" in r for r in train_rows)
    if name in ("r3", "partial-r3"):
        assert all("moe/rollout_train_disagreement" in r for r in train_rows)
    if name.startswith("partial"):
        assert all(0 <= r["rollout/token_staleness"] <= r["rollout/staleness"] for r in train_rows)


@pytest.mark.parametrize("partial", ["off", "continue"])
def test_async_multi_turn_episodes_with_a_tool(tmp_path, cold_start_root, partial):
    run_dir = tmp_path / "tools"
    config = make_config(
        run_dir, cold_start_root, *TOOLS, "rollout.max_staleness=1", f"rollout.partial={partial}", task="calculator"
    )
    train(config, progress=False)
    rows = assert_finite_metrics(run_dir, 3)
    assert _staleness(rows) == [0.0, 1.0, 1.0]
    assert all("episode/turns_mean" in r and "tool/calls_per_episode" in r for r in _train_rows(rows))
    if partial == "continue":  # every episode's policy tokens carry their versions through the turns
        assert all(0 <= r["rollout/token_staleness"] <= r["rollout/staleness"] for r in _train_rows(rows))


def test_async_on_vllm_and_deepspeed(tmp_path, cold_start_root):
    """Through `rlzoo train` in a subprocess: DeepSpeed and vLLM in this process would leave state behind them."""
    pytest.importorskip("vllm")
    pytest.importorskip("deepspeed")
    from test_resume import rlzoo, write_config

    config = write_config(
        tmp_path / "run.yaml",
        cold_start_root / "arithmetic",
        [
            "rollout.max_staleness=2",
            "train.steps=4",
            "rollout.engine={name: vllm, kv_cache_memory_bytes: 67108864}",
            "trainer.engine={name: deepspeed, zero_stage: 2, moe: deepspeed}",
            "algorithm.router={name: replay-rollout}",
        ],
    )
    run_dir = tmp_path / "vllm"
    run = rlzoo("train", str(config), "--set", f"output_dir={run_dir}")
    assert run.wait(timeout=600) == 0, run.stderr.read().decode()
    rows = assert_finite_metrics(run_dir, 4)
    assert _staleness(rows)[0] == 0.0 and all(0 <= s <= 2 for s in _staleness(rows)) and max(_staleness(rows)) > 0
    assert all("moe/rollout_train_disagreement" in r for r in _train_rows(rows))  # R3 on vLLM's recorded routing
    evaluations = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/accuracy" in r]
    assert len(evaluations) >= 2  # the producer paused for the evaluations, which ran on the same engine


@pytest.mark.parametrize("k", [0, pytest.param(2, marks=pytest.mark.slow)])  # k = 2: the same path, not exact
def test_async_killed_anywhere_resumes_with_every_step_once(tmp_path, cold_start_root, k):
    """SIGKILL after the step-4 checkpoint, with batches queued or in flight: they are dropped, the resumed run trains
    steps 4..7 once each. With k = 0 the run is deterministic, so it must log the uninterrupted run's metrics."""
    from test_resume import STEPS, kill_after_checkpoint, rlzoo, write_config

    config = write_config(tmp_path / "run.yaml", cold_start_root / "arithmetic", [f"rollout.max_staleness={k}"])
    killed_dir = tmp_path / "killed"
    victim = rlzoo("train", str(config), "--set", f"output_dir={killed_dir}")
    kill_after_checkpoint(victim, killed_dir, "step_000004")
    before = _train_rows(read_metrics(killed_dir / "metrics.jsonl"))
    assert len(before) < STEPS

    resumed = rlzoo("train", str(config), "--resume", str(killed_dir))
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()
    rows = read_metrics(killed_dir / "metrics.jsonl")
    train_rows = _train_rows(rows)
    assert [r["step"] for r in train_rows] == list(range(STEPS))  # every step once, none twice
    assert train_rows[:4] == before[:4]
    assert train_rows[4]["rollout/staleness"] == 0.0 and all(0 <= s <= k for s in _staleness(rows))
    if k == 0:
        reference = tmp_path / "reference"
        run = rlzoo("train", str(config), "--set", f"output_dir={reference}")
        assert run.wait(timeout=600) == 0, run.stderr.read().decode()
        assert metrics_without_times(rows) == metrics_without_times(read_metrics(reference / "metrics.jsonl"))
