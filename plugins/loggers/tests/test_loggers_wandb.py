"""The wandb logger, offline, read back from the ``.wandb`` files it writes."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
from loggers_testlib import (
    TAGS,
    artifacts,  # noqa: F401 (a fixture)
    log_steps,
    read_wandb,
    step_metrics,
    tracked_run,
    whole_run,
)

from rlzoo_loggers.common import read_state
from rlzoo_loggers.wandb_logger import WandbLogger

pytest.importorskip("wandb")

STEPS = 6


def values(history: dict, key: str) -> dict[int, float]:
    return {step: row[key] for step, row in history.items() if key in row}


@pytest.mark.parametrize("through_trackers", [False, True])
def test_config_metrics_summary_and_artifacts(tmp_path, artifacts, through_trackers, capfd):
    if importlib.util.find_spec("openai") is not None:  # vLLM imports it; wandb then adverts Weave on the console
        import openai  # noqa: F401 - imported for that side effect
    run = tracked_run(tmp_path, state_dir=tmp_path / "run" / "loggers" / "wandb")
    logger = WandbLogger()
    environ = dict(os.environ)
    summary = whole_run(logger, run, STEPS, artifacts, through_trackers)
    # the environment is left as it was, but for wandb's own address of its service process (wandb.setup sets it)
    changed = {k for k in {*environ, *os.environ} if environ.get(k) != os.environ.get(k)}
    assert changed <= {"WANDB_SERVICE"}

    (read,) = read_wandb(run.run_dir)
    assert read["id"] == read_state(run.state_dir)["id"] == logger.run_id
    assert read["run"].display_name == "cell/seed1" and read["run"].run_group == "sw"
    assert read["run"].project == "rlzoo"
    assert sorted(read["run"].tags) == sorted(f"{k}={v}" for k, v in TAGS.items())
    config = read["config"]
    assert config["seed"] == 1 and config["output_dir"] == str(run.run_dir)
    assert config["tracking"]["tags"] == TAGS  # filterable as config.tracking.tags.cell
    assert config["algorithm"] == run.config["algorithm"]

    history = read["history"]
    assert sorted(history) == list(range(STEPS + 1))
    assert read["history_rows"] == list(range(STEPS + 1))  # one row per step
    assert values(history, "loss") == pytest.approx({s: 1.0 / (s + 1) for s in range(STEPS)})
    grad = values(history, "grad/norm")
    assert math.isnan(grad.pop(2)) and grad == {s: float(s) for s in range(STEPS) if s != 2}  # NaN kept
    assert values(history, "eval/accuracy") == pytest.approx({0: 0.5, 5: 0.55, STEPS: 0.9})
    image = history[STEPS]["artifacts/curves"]
    assert image["_type"] == "image-file" and (image["width"], image["height"]) == (100, 75)
    assert (read["folder"] / "files" / image["path"]).read_bytes() == artifacts[0].read_bytes()

    for key, value in summary.items():
        assert read["summary"][key] == value
    (artifact,) = read["artifacts"]
    assert artifact.type == "run-results" and artifact.name == f"run-results-{logger.run_id}"
    entries = {entry.path: entry for entry in artifact.manifest.contents}
    assert set(entries) == {"curves.png", "config.yaml"}
    kept = run.state_dir / "artifact" / "curves.png"  # a copy in the run folder, as it was: what wandb sync uploads
    assert entries["curves.png"].local_path == str(kept) and kept.read_bytes() == artifacts[0].read_bytes()
    assert read["exit"].exit_code == 0

    out, err = capfd.readouterr()
    assert "wandb" not in out + err  # quiet: no banner, no sync hints


def test_resume_continues_the_same_run_without_repeating_steps(tmp_path, artifacts):
    state_dir = tmp_path / "run" / "loggers" / "wandb"
    first = WandbLogger()
    first.start(tracked_run(tmp_path, state_dir=state_dir))
    log_steps(first, range(8))
    first.close()  # killed after step 7: no finish
    second = WandbLogger()
    second.start(tracked_run(tmp_path, state_dir=state_dir, resumed_at=5, logged_through=7))
    log_steps(second, range(5, 10))
    second.finish({"steps": 10.0}, artifacts)
    second.close()

    reads = read_wandb(tmp_path / "run")
    assert len(reads) == 2  # one offline folder per process, the same wandb run (wandb sync uploads both)
    assert {r["id"] for r in reads} == {first.run_id} == {second.run_id}
    assert reads[0]["exit"].exit_code == 1 and reads[1]["exit"].exit_code == 0  # the killed one shows as failed
    rows = reads[0]["history_rows"] + reads[1]["history_rows"]
    assert rows == list(range(10))  # each step once
    losses = {**values(reads[0]["history"], "loss"), **values(reads[1]["history"], "loss")}
    assert losses == pytest.approx({s: step_metrics(s)["loss"] for s in range(10)})


def test_a_fresh_start_makes_a_new_wandb_run(tmp_path):
    state_dir = tmp_path / "run" / "loggers" / "wandb"
    ids = []
    for _ in range(2):
        logger = WandbLogger()
        logger.start(tracked_run(tmp_path, state_dir=state_dir))
        logger.close()
        ids.append(logger.run_id)
    assert ids[0] != ids[1]
