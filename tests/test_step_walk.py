"""The walk of the step record through one RL step stays short (issue 47 item 1): the first-party calls handed the
step's ``StepRecord`` (and, apart, the ``Components`` ``c``) climb back up the core's layers at most 3 times and
return to a file they left at most 5 times. The measure is ``scripts/step_walk.py``'s (its docstring defines it), on
one real fixed-seed step of the tiny example; ``python scripts/step_walk.py`` prints the walks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from test_structure import LAYERS

ROOT = Path(__file__).resolve().parents[1]
MAX_CLIMBS, MAX_RETURNS = 3, 5
PHASES = {"rl_step", "rollout_batch", "old_pass", "advantages", "minibatch_updates", "step_metrics"}


def _load_script():
    spec = importlib.util.spec_from_file_location("step_walk", ROOT / "scripts" / "step_walk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


step_walk = _load_script()


@pytest.fixture(scope="module")
def walks(tmp_path_factory):
    """Step 0 of the tiny example (hf rollouts, torch training; set up in ~10 s on 2 cores, the step ~4 s under the
    profiler), both walks from one run."""
    with step_walk.tiny_step(tmp_path_factory.mktemp("walk")) as step:
        return step_walk.measure(step)


def test_the_layers_are_the_structure_tests_declared_order():
    assert step_walk.LAYERS == LAYERS


def test_the_counts_read_the_walks_files_in_order():
    """Consecutive calls in one file are one stop; a return is a stop in a file entered and left before; a climb is a
    stop in a higher layer than the one before it (back from a call down, or called back from below)."""
    stops = {name: step_walk.stop_of(str(ROOT / name)) for name in ("rlzoo/rl/loop.py", "rlzoo/rl/step_record.py")}
    stops["engine"] = step_walk.stop_of(str(ROOT / "rlzoo/engines/torch_trainer.py"))
    stops["plugin"] = step_walk.stop_of(str(ROOT / "estimators/rlzoo_estimators/clippers/ppo.py"))
    assert stops["plugin"] == step_walk.Stop("plugin:estimators", len(LAYERS))
    assert stops["engine"].layer < stops["rlzoo/rl/loop.py"].layer == stops["rlzoo/rl/step_record.py"].layer
    assert step_walk.stop_of("<string>") is None and step_walk.stop_of(str(ROOT / "tests/test_step_walk.py")) is None
    order = ["rlzoo/rl/loop.py", "rlzoo/rl/loop.py", "engine", "rlzoo/rl/loop.py", "plugin", "engine"]
    order += ["rlzoo/rl/step_record.py", "rlzoo/rl/loop.py"]
    walk = step_walk.Walk("x", [step_walk.Call(0, stops[name], "f", 1) for name in order])
    # loop -> engine -> loop (climb, return) -> plugin (climb) -> engine (return) -> step_record (climb) -> loop
    assert walk.counts() == {"files": 4, "climbs": 3, "returns": 3}


def test_the_step_records_walk_climbs_back_at_most_3_times_and_returns_at_most_5(walks):
    record = walks["record"]
    assert PHASES <= {call.function for call in record.calls}, record.render()  # it followed the record
    counts = record.counts()
    assert counts["climbs"] <= MAX_CLIMBS and counts["returns"] <= MAX_RETURNS, record.render()


def test_the_components_walk_climbs_back_at_most_3_times_and_returns_at_most_5(walks):
    components = walks["components"]
    assert {"rl_step", "old_pass", "minibatch_updates"} <= {call.function for call in components.calls}
    counts = components.counts()
    assert counts["climbs"] <= MAX_CLIMBS and counts["returns"] <= MAX_RETURNS, components.render()
