"""A resume refuses a config that changes the run's math or shapes, names each field with its old and new value,
goes ahead with ``--allow-changes`` and records what changed; ``config.yaml`` is never rewritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_testlib import run_cli
from test_cli import TINY_RUN

from rlzoo.config.loading import dump_config
from rlzoo.config.schema import RunConfig
from rlzoo.preflight.resume_changes import (
    CHANGES_FILE,
    config_changes,
    effective_config,
    flatten,
    record_changes,
    refused,
)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "gspo_tiny_moe.yaml"
ENGINES = ["rollout.engine={name: hf}", "trainer.engine={name: torch}"]


def test_flatten_is_dotted_leaves_with_lists_whole():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": {}}) == {"a.b": 1, "a.c": [1, 2], "d": None, "e": {}}


def test_changes_against_the_saved_config_and_the_recorded_ones(tmp_path):
    first = RunConfig.model_validate({"trainer": {"lr": 1e-4}, "train": {"steps": 4}})
    (tmp_path / "config.yaml").write_text(dump_config(first))
    later = first.model_copy(deep=True, update={"trainer": first.trainer.model_copy(update={"lr": 1e-2})})
    later = later.model_copy(update={"train": later.train.model_copy(update={"steps": 8})})
    changes = config_changes(tmp_path, later)
    assert changes == {"trainer.lr": (1e-4, 1e-2), "train.steps": (4, 8)}
    assert refused(changes) == {"trainer.lr": (1e-4, 1e-2)}  # the step count may change
    assert refused(changes, ["trainer.lr"]) == {} and refused(changes, ["trainer"]) == {}
    assert refused(changes, ["trainer.l"]) == refused(changes)  # a field or a section, not a prefix of a name
    # a field added to rlzoo after the run started is no change at its default, a change otherwise
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del saved["trainer"]["grad_clip"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    assert config_changes(tmp_path, later) == changes
    clipped = later.model_copy(update={"trainer": later.trainer.model_copy(update={"grad_clip": 0.5})})
    assert config_changes(tmp_path, clipped)["trainer.grad_clip"] == (None, 0.5)
    (tmp_path / "config.yaml").write_text(dump_config(first))

    record_changes(tmp_path, 4, changes)
    assert config_changes(tmp_path, later) == {}  # the effective config has them now
    row = json.loads((tmp_path / CHANGES_FILE).read_text())
    assert row["step"] == 4 and row["changes"]["trainer.lr"] == [1e-4, 1e-2]
    assert effective_config(tmp_path)["trainer.lr"] == 1e-2
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["trainer"]["lr"] == 1e-4  # the record stays


def test_a_component_parameter_added_since_the_run_started_is_no_change_at_its_default(tmp_path):
    from rlzoo.config.resolution import load_config
    from rlzoo.registry import default_registry

    registry = default_registry()
    config = load_config(CONFIG, ENGINES, registry)  # components resolved: every parameter written out
    saved = yaml.safe_load(dump_config(config))
    del saved["algorithm"]["advantage"]["eps"]  # as if the advantage had no such parameter then
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    assert config_changes(tmp_path, config, registry) == {}
    assert "algorithm.advantage.eps" in config_changes(tmp_path, config)  # without the registry: unknown default
    changed = load_config(CONFIG, [*ENGINES, "algorithm.advantage.eps=1e-4"], registry)
    assert config_changes(tmp_path, changed, registry) == {"algorithm.advantage.eps": (None, 1e-4)}


def _train(tmp_path: Path, run_dir: Path, *sets: str, resume: bool = False, allow: tuple[str, ...] = ()):
    overrides = [*TINY_RUN, *ENGINES, f"cold_start.output_dir={tmp_path / 'cold'}", f"output_dir={run_dir}", *sets]
    argv = ["train", str(CONFIG), *(a for o in overrides for a in ("--set", o))]
    if resume:
        argv += ["--resume", str(run_dir)]
    if allow:
        argv += ["--allow-changes", *allow]
    return run_cli(argv, tmp_path)


def test_resume_with_changed_math_is_refused_then_allowed_and_recorded(tmp_path):
    run_dir = tmp_path / "run"
    first = _train(tmp_path, run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = (run_dir / "config.yaml").read_bytes()
    changed = ("trainer.lr=0.01", "rollout.group_size=4", "train.steps=2")

    refused_run = _train(tmp_path, run_dir, *changed, resume=True)
    assert refused_run.returncode == 1 and "Traceback" not in refused_run.stderr
    message = refused_run.stderr
    for field, old, new in (("trainer.lr", "0.0002", "0.01"), ("rollout.group_size", "2", "4")):
        assert field in message and f"{old} -> {new}" in message, message
    assert "train.steps" not in message and "--allow-changes" in message
    assert (run_dir / "config.yaml").read_bytes() == saved and not (run_dir / CHANGES_FILE).exists()

    allowed = _train(tmp_path, run_dir, *changed, resume=True, allow=("trainer.lr", "rollout"))
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert (run_dir / "config.yaml").read_bytes() == saved  # never rewritten
    (row,) = [json.loads(line) for line in (run_dir / CHANGES_FILE).read_text().splitlines()]
    assert row["step"] == 1
    assert row["changes"] == {"rollout.group_size": [2, 4], "train.steps": [1, 2], "trainer.lr": [0.0002, 0.01]}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [0, 1]


@pytest.mark.parametrize("change", ["model.tiny.hidden_size=32", "algorithm.preset=grpo"])
def test_config_check_names_a_changed_shape_or_algorithm(tmp_path, change):
    run_dir = tmp_path / "run"
    assert _train(tmp_path, run_dir).returncode == 0
    overrides = [*TINY_RUN, *ENGINES, f"cold_start.output_dir={tmp_path / 'cold'}", change]
    argv = ["config", "check", str(CONFIG), *(a for o in overrides for a in ("--set", o))]
    proc = run_cli([*argv, "--resume", str(run_dir)], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert change.split("=")[0].rsplit(".", 1)[0] in proc.stderr and "changed since the run started" in proc.stderr
