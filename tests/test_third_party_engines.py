"""A third party's rollout and training engines, pip-installed into a fresh virtual environment, are checked and
trained on by name like the first-party ones (issue 20).

The distribution ``rlzoo-thirdparty-engines`` is the real source tree ``tests/third_party_engines`` (copied to a
temporary folder first, so no build artefacts land in the repository), installed into the session's venv layered over
the test environment (tests/venv_testlib.py). It registers ``relay-rollout`` (transformers generate in lanes,
with the check rule ``lanes`` divides ``rollout.group_size``; it reports its lane calls and weight syncs) and
``relay-trainer`` (plain torch that reports how often the core called its ``routing_pass`` and weight-copy methods
as ``relay/*`` metrics). Both import their base engine from ``rlzoo.engines``, the public import.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import TINY_RUN
from test_third_party_plugin import rlzoo_cli
from venv_testlib import PluginVenv

pytestmark = pytest.mark.timeout(300)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gspo_tiny_moe.yaml"
DIST = "rlzoo-thirdparty-engines"


def engines(lanes: int) -> list[str]:
    return [f"rollout.engine={{name: relay-rollout, lanes: {lanes}}}", "trainer.engine={name: relay-trainer}"]


def sets(overrides: list[str]) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


# the main job shortened as far as tests/test_cli.py's tiny run, for 3 RL steps
THREE_STEPS = {"train.steps": "3", "train.eval_every": "3", "train.checkpoint_every": "3"}
SHORT = [f"{key}={THREE_STEPS.get(key, value)}" for key, value in (item.split("=", 1) for item in TINY_RUN)]


@pytest.fixture
def venv(plugin_venv: PluginVenv) -> Path:
    """The session's venv (tests/conftest.py), with ``rlzoo-thirdparty-engines`` installed; its python."""
    plugin_venv.assert_installed_here("rlzoo_thirdparty_engines")
    return plugin_venv.python


def test_both_engines_are_listed_with_their_distribution(venv, tmp_path):
    proc = rlzoo_cli(venv, "plugins", "list", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(proc.stdout)}
    for key in (("rollout_engine", "relay-rollout"), ("training_engine", "relay-trainer")):
        assert rows[key]["distribution"] == DIST and rows[key]["plugin"] == "thirdparty-engines", rows.get(key)
        assert rows[key]["duplicate"] is False
    assert {("rollout_engine", "hf"), ("training_engine", "torch")} <= set(rows)  # the first-party ones beside them


def test_config_check_reports_the_engines_own_rule_by_field(venv, tmp_path):
    # the main job's group_size is 8: lanes 3 breaks relay-rollout's rule, lanes 2 keeps it
    proc = rlzoo_cli(venv, "config", "check", EXAMPLE, *sets(engines(3)), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "rollout.engine.lanes: 3 does not divide rollout.group_size 8; use one of [1, 2, 4, 8]" in proc.stderr
    # (train refuses it too, at its start: it runs the same preflight, tests/test_bad_configs.py)

    proc = rlzoo_cli(venv, "config", "check", EXAMPLE, *sets(engines(2)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "relay-rollout" in proc.stdout and "relay-trainer" in proc.stdout  # the resolved config


def test_main_job_trains_on_the_third_party_engines_with_routing_replay(venv, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        *engines(2),  # group_size 2: one response per lane
        "algorithm.router={name: replay-old}",  # Routing Replay (R2) on the tiny Qwen3-MoE
        "rollout.overlap=1",  # the old-log-prob pass under the sampling weights: copy/exchange/restore_weights
        *SHORT,
        f"output_dir={run_dir}",
    ]
    proc = rlzoo_cli(venv, "train", EXAMPLE, *sets(overrides), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rollout relay-rollout, trainer relay-trainer" in proc.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert [r["moe/flip_rate"] for r in steps] == [0.0, 0.0, 0.0]  # replay pinned every update pass's experts
    assert [r["rollout/staleness"] for r in steps] == [0.0, 1.0, 1.0]
    # the core recorded and replayed the routing through relay-trainer's routing_pass, every step
    passes = [r["relay/routing_passes"] for r in steps]
    assert passes[0] > 0 and passes == sorted(set(passes)), passes
    # and kept the sampling weights through its copy_weights / exchange_weights / restore_weights
    assert steps[-1]["relay/weight_copies"] > 0
    # relay-rollout's own reports (Component.report): each step's batch sampled in 2 lanes (a prefetched batch's
    # in the background thread), and the weight sync after each step's update
    assert [r["rollout_engine/relay-rollout/lane_calls"] for r in steps] == [2.0, 2.0, 2.0]
    assert [r["rollout_engine/relay-rollout/syncs"] for r in steps] == [1.0, 1.0, 1.0]
    assert rows[-1].get("final") == 1.0 and "eval/accuracy" in rows[-1]
