"""The tensorboard logger, read back with TensorBoard's own reader."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from loggers_testlib import (
    TAGS,
    artifacts,  # noqa: F401 (a fixture)
    log_steps,
    step_metrics,
    tracked_run,
    whole_run,
)

from rlzoo_loggers.tensorboard_logger import TensorBoardLogger

pytest.importorskip("tensorboard")

STEPS = 6


def read(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    reader.Reload()
    return reader


def series(reader, tag: str) -> tuple[list[int], list[float]]:
    """A scalar's steps and values, in the reader's order."""
    events = reader.Scalars(tag)
    return [e.step for e in events], [e.value for e in events]


def text(reader, tag: str) -> str:
    (event,) = reader.Tensors(f"{tag}/text_summary")  # torch's add_text names it so
    return event.tensor_proto.string_val[0].decode()


@pytest.mark.parametrize("through_trackers", [False, True])
def test_metrics_config_summary_and_plot(tmp_path, artifacts, through_trackers):
    run = tracked_run(tmp_path)
    logger = TensorBoardLogger()
    summary = whole_run(logger, run, STEPS, artifacts, through_trackers)

    reader = read(run.run_dir / "tensorboard")
    steps = list(range(STEPS))
    assert series(reader, "loss") == (steps, pytest.approx([1.0 / (s + 1) for s in steps]))
    assert series(reader, "reward/mean") == (steps, pytest.approx([0.1 * s for s in steps]))
    # the NaN of step 2 is left out, the other steps kept
    assert series(reader, "grad/norm") == ([s for s in steps if s != 2], [float(s) for s in steps if s != 2])
    assert series(reader, "eval/accuracy") == ([0, 5, STEPS], pytest.approx([0.5, 0.55, 0.9]))
    for key, value in summary.items():
        assert series(reader, f"summary/{key}") == ([STEPS], pytest.approx([value]))

    config = text(reader, "config")
    assert "seed: 1" in config and "group: sw" in config and "lr=0.001" in config
    assert "| steps | 6 |" in text(reader, "summary")
    (image,) = reader.Images("artifacts/curves")
    assert image.step == STEPS and image.encoded_image_string == artifacts[0].read_bytes()
    assert (image.width, image.height) == (100, 75)

    # the HParams dashboard's session: the flattened config
    from tensorboard.plugins.hparams import plugin_data_pb2

    contents = reader.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["seed"].number_value == 1
    assert start.hparams["tracking.tags.cell"].string_value == TAGS["cell"]
    assert "_hparams_/session_end_info" in contents


def test_resume_purges_the_steps_run_again(tmp_path, artifacts):
    first = TensorBoardLogger()
    first.start(tracked_run(tmp_path))
    log_steps(first, range(8))
    first.close()  # killed after step 7: no finish
    # the resumed process runs steps 5.. again (from the checkpoint at 5), with the same values
    second = TensorBoardLogger()
    second.start(tracked_run(tmp_path, resumed_at=5, logged_through=7))
    log_steps(second, range(5, 10))
    second.finish({"steps": 10.0}, artifacts)
    second.close()

    reader = read(tmp_path / "run" / "tensorboard")
    assert len(list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))) == 2
    # each step once: the earlier file's steps 5..7 purged, the resumed process's kept
    assert series(reader, "loss") == (list(range(10)), pytest.approx([1.0 / (s + 1) for s in range(10)]))
    assert "seed: 1" in text(reader, "config")  # written once, at the fresh start


def test_non_finite_values_are_left_out_without_error(tmp_path):
    logger = TensorBoardLogger()
    logger.start(tracked_run(tmp_path))
    logger.log_metrics(0, {"a": math.inf, "b": -math.inf, "c": math.nan, "d": 1.0})
    logger.close()
    reader = read(tmp_path / "run" / "tensorboard")
    assert reader.Tags()["scalars"] == ["d"]
    assert step_metrics(0)["loss"] == 1.0
