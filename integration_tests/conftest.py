"""Shared set-up for end-to-end runs: tiny models, a short cold start built once per session."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import pytest

from rlzoo.config.loading import read_yaml
from rlzoo.config.resolution import build_config
from rlzoo.reporting.metrics_log import read_metrics

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gspo_tiny_moe.yaml"

# small enough for CI: a 2-layer MoE, a few SFT steps, a few RL steps with 4 prompts x 4 responses, on the
# in-process engines (tests of vLLM and DeepSpeed select them explicitly)
FAST = [
    "rollout.engine={name: hf}",
    "trainer.engine={name: torch}",
    "cold_start.steps=40",
    "cold_start.batch_size=16",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "train.steps=3",
    "train.eval_every=2",
    "train.eval_prompts=16",
    "train.checkpoint_every=2",
]


@pytest.fixture(scope="module", autouse=True)
def _no_process_group_left_behind():
    """A module that trains with DeepSpeed in this process leaves a torch.distributed group listening on the port
    it put in ``MASTER_PORT``; later modules' subprocesses would inherit that variable and fail to bind the port."""
    yield
    from rlzoo.engines.deepspeed.env import shutdown_distributed

    shutdown_distributed()


@pytest.fixture(scope="session")
def cold_start_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cold_start")


# a preset whose advantage normalises the reward's named parts one by one (gdpo) needs a verifier that returns them
VERIFIER_FOR = {
    "gdpo": "verifier={name: weighted, verifiers: [{name: math, label: correct}, "
    "{name: regex, pattern: '[0-9]+', label: format, weight: 0.5}]}",
}


def preset_needs(preset: str) -> list[str]:
    """The overrides a preset needs beyond the main job's config to run at all (its verifier's reward parts)."""
    return [VERIFIER_FOR[preset]] if preset in VERIFIER_FOR else []


def make_config(run_dir: Path, cold_start_root: Path, *overrides: str, task: str = "arithmetic", registry=None):
    cold = cold_start_root / task
    return build_config(
        read_yaml(EXAMPLE),
        [*FAST, f"output_dir={run_dir}", f"cold_start.output_dir={cold}", *overrides],
        registry,
    )


def assert_finite_metrics(run_dir: Path, steps: int) -> list[dict]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train_rows] == list(range(steps))
    for row in train_rows:
        for key in ("reward/mean", "clip/fraction", "ratio/mean", "time/rollout", "time/train", "loss/policy"):
            assert key in row, (key, row)
            assert math.isfinite(row[key]), (key, row)
    assert rows[-1].get("final") == 1.0 and "eval/accuracy" in rows[-1]
    return rows


def metrics_without_times(rows: list[dict]) -> list[dict]:
    return [json.loads(json.dumps({k: v for k, v in r.items() if not k.startswith("time/")})) for r in rows]


# -- vLLM servers (test_vllm_server*.py) ----------------------------------------------------------------------------


def group_processes(group: int) -> list[int]:
    """The live (not zombie) processes of process group ``group``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == group:
                found.append(int(entry))
    return found


def wait_gone(group: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while group_processes(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    return group_processes(group)


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """Where vLLM finds rlzoo's entry point when this environment's install predates it (``pip install -e .`` adds
    it): a dist-info folder on sys.path and on the servers' PYTHONPATH, for this module only."""
    from rlzoo.engines.vllm_server import launcher

    if launcher.plugin_installed():
        yield
        return
    root = tmp_path_factory.mktemp("plugin")
    info = root / "rlzoo_gloo_dev-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlzoo-gloo-dev\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nrlzoo_gloo = {launcher.PLUGIN}\n")
    old = os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *sys.path[1:]])
    yield
    sys.path.remove(str(root))
    os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)
