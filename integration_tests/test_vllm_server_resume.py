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

import random
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

from prompt_ids_verifier import PREFIX  # noqa: E402
from test_resume import STEPS, _kill, _wait_for, kill_after_checkpoint, rlzoo, write_config  # noqa: E402

from rlzoo.reporting.metrics_log import read_metrics  # noqa: E402
from rlzoo.runtime.checkpoint.files import latest_checkpoint  # noqa: E402
from rlzoo.runtime.checkpoint.store import PAUSE_ENV  # noqa: E402

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


@pytest.mark.slow  # five runs, each with its own server (~10 min on two loaded cores)
def test_a_run_on_launched_servers_killed_anywhere_resumes_to_the_same_metrics(plugin_path, tmp_path, cold_start_root):
    """test_resume.py's kill-anywhere on a launched server: killed while writing a checkpoint, then twice at seeded
    random moments (after the k-th metrics line plus a delay within a step: a generation, a push or an update in
    flight); each kill takes the server with it, each resume starts a new one from the checkpoint's model, and the
    last resume logs the uninterrupted run's metrics."""
    one_digit = [LAUNCH, "task.digits=1", "cold_start.steps=100"]
    config = write_config(tmp_path / "run.yaml", cold_start_root / "arithmetic-1digit", one_digit)
    reference = rlzoo("train", str(config), "--set", f"output_dir={tmp_path / 'reference'}")
    assert reference.wait(timeout=1200) == 0, reference.stderr.read().decode()[-3000:]

    run_dir, marker = tmp_path / "killed", tmp_path / "half-written"
    checkpoints = run_dir / "checkpoints"
    victim = rlzoo("train", str(config), "--set", f"output_dir={run_dir}", env={PAUSE_ENV: str(marker)})
    _wait_for(victim, marker.exists, "the first checkpoint", timeout=1200)
    marker.unlink()
    _wait_for(victim, marker.exists, "the second checkpoint", timeout=1200)
    _kill(victim)
    assert latest_checkpoint(run_dir) == checkpoints / "step_000002"
    assert any(p.name.startswith(".step_000004.tmp-") for p in checkpoints.iterdir())  # the half-written one

    rng, kills = random.Random(5), 0
    for _ in range(2):
        # a step past every line the killed run left (the resumed run rewrites the file from its checkpoint, but
        # only once it has set up): the line that triggers the kill is the resumed run's own
        logged = max(r["step"] for r in read_metrics(run_dir / "metrics.jsonl"))
        first = max(logged, int(latest_checkpoint(run_dir).name.removeprefix("step_"))) + 1
        if first > STEPS - 1:
            break
        step, delay = rng.randint(first, STEPS - 1), rng.uniform(0.0, 3.0)
        victim = rlzoo("train", str(config), "--resume", str(run_dir))
        _wait_for(victim, lambda step=step: _logged(run_dir, step), f"step {step}'s metrics", timeout=1200)
        time.sleep(delay)
        assert victim.poll() is None, "the run ended before it could be killed"
        _kill(victim)
        kills += 1
    assert kills >= 1

    resumed = rlzoo("train", str(config), "--resume", str(run_dir))
    assert resumed.wait(timeout=1200) == 0, resumed.stderr.read().decode()[-3000:]
    expected = metrics_without_times(read_metrics(tmp_path / "reference" / "metrics.jsonl"))
    actual = metrics_without_times(read_metrics(run_dir / "metrics.jsonl"))
    assert [r["step"] for r in actual] == list(range(STEPS + 1))
    assert any(r.get("reward/mean", 0) > 0 for r in expected[4:])
    assert actual == expected
    # a new server for the first run and each resume that got as far (a random kill may come before the launch),
    # the last one started from a checkpoint's model
    log = (run_dir / "rollout_servers" / "server_0.log").read_text()
    launches = [line for line in log.splitlines() if line.startswith("--- rlzoo: ")]
    assert 2 <= len(launches) <= 4 and f"--model {checkpoints}/step_" in launches[-1], launches


def _logged(run_dir: Path, step: int) -> bool:
    return any(r["step"] >= step for r in read_metrics(run_dir / "metrics.jsonl"))


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
