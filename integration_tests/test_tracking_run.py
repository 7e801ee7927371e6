"""The run calls its loggers (``loggers: [...]``) as docs/loggers.md says: once started with the config, every step's
metrics, each evaluation, the summary and artifacts at the end, closed always; a failing one is dropped with one
warning and the others and ``metrics.jsonl`` go on; a resume tells each logger where it resumes and what it was given.
Third-party loggers here, registered as a plugin registers them; the built-in trackers are tested in plugins/loggers."""

from __future__ import annotations

import logging
import types

import pytest
from runs_testlib import make_config

import rlzoo
from rlzoo.interfaces import Logger, Params
from rlzoo.registry import Registry
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.run import train

CALLS: dict[str, list] = {}


class Recording(Logger):
    """Records every call, by its ``label``."""

    name = "recording"

    class Params(Params):
        label: str = "a"

    def start(self, run):
        CALLS.setdefault(self.params.label, []).append(("start", run))

    def log_metrics(self, step, metrics):
        CALLS[self.params.label].append(("metrics", step, dict(metrics)))

    def log_evaluation(self, step, metrics):
        CALLS[self.params.label].append(("evaluation", step, dict(metrics)))

    def finish(self, summary, artifacts):
        CALLS[self.params.label].append(("finish", dict(summary), list(artifacts)))

    def close(self):
        CALLS[self.params.label].append(("close",))


class Failing(Logger):
    """Raises at its second step, as a tracker whose server went away."""

    name = "failing"

    def start(self, run):
        self.steps = 0

    def log_metrics(self, step, metrics):
        self.steps += 1
        if self.steps == 2:
            raise ConnectionError("server went away")

    def close(self):
        CALLS.setdefault("failing-closed", []).append(True)


class NeedsMissing(Logger):
    """Declares a package nobody installed."""

    name = "needs-missing"
    requires = ("rlzoo_no_such_tracker_package",)
    install_hint = "pip install rlzoo-no-such-tracker"

    def start(self, run):
        raise AssertionError("never started: its package is missing")


def _registry() -> Registry:
    registry = Registry.discover()
    plugin = types.ModuleType("test_loggers")
    plugin.rlzoo_loggers = rlzoo.hookimpl(lambda: [Recording, Failing, NeedsMissing])
    plugin.rlzoo_loggers.__name__ = "rlzoo_loggers"
    registry.add_plugin(plugin, name="test-loggers", distribution="tests")
    assert not registry.load_errors, registry.load_errors
    return registry


@pytest.fixture(autouse=True)
def _fresh_calls():
    CALLS.clear()


def test_every_logger_gets_the_run_and_a_failing_one_is_dropped_with_one_warning(tmp_path, cold_start_root, caplog):
    registry = _registry()
    run_dir = tmp_path / "run"
    config = make_config(
        run_dir,
        cold_start_root,
        "loggers=[{name: failing}, {name: recording, label: a}, {name: needs-missing}, {name: recording, label: b}]",
        "tracking.tags={cell: c1, seed: 0}",
        "tracking.group=sweep",
        registry=registry,
    )
    with caplog.at_level(logging.WARNING):
        train(config, registry=registry, progress=False)

    rows = read_metrics(run_dir / "metrics.jsonl")
    for label in ("a", "b"):
        calls = CALLS[label]
        kind = [c[0] for c in calls]
        assert kind[0] == "start" and kind[-2:] == ["finish", "close"], kind
        run = calls[0][1]
        assert run.run_dir == run_dir and run.name == "run" and run.group == "sweep"
        assert run.tags == {"cell": "c1", "seed": "0"} and run.store_dir == run_dir
        assert run.state_dir == run_dir / "loggers" / "recording" and run.resumed_at is None
        assert run.config["trainer"]["lr"] == config.trainer.lr and run.config["loggers"][1]["label"] == "a"
        # every row of metrics.jsonl, the final evaluation's included, with the same values
        logged = [(c[1], c[2]) for c in calls if c[0] == "metrics"]
        assert logged == [(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in rows]
        evaluations = [c[1] for c in calls if c[0] == "evaluation"]
        assert evaluations == [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2, 3]
        assert all(set(c[2]) >= {"eval/accuracy"} and "reward/mean" not in c[2] for c in calls if c[0] == "evaluation")
        _, summary, artifacts = calls[-2]
        assert summary["eval/accuracy"] == rows[-1]["eval/accuracy"] and summary["steps"] == 3.0
        assert {a.name for a in artifacts} == {"config.yaml", "curves.png"} and all(a.is_file() for a in artifacts)

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "logger" in r.getMessage()]
    failed = [w for w in warnings if "'failing'" in w]
    assert len(failed) == 1 and "server went away" in failed[0] and "loggers.0" in failed[0], warnings
    assert CALLS["failing-closed"] == [True]  # released once dropped
    missing = [w for w in warnings if "'needs-missing'" in w]
    assert len(missing) == 1 and "rlzoo_no_such_tracker_package" in missing[0] and "pip install" in missing[0]


def test_a_resumed_run_tells_its_loggers_where_it_resumes_and_what_they_were_given(tmp_path, cold_start_root):
    registry = _registry()
    run_dir = tmp_path / "run"
    config = make_config(run_dir, cold_start_root, "loggers=[{name: recording}]", "train.steps=3", registry=registry)
    train(config, registry=registry, progress=False)
    assert (run_dir / "loggers" / "recording" / "logged_through.json").is_file()
    CALLS.clear()

    longer = config.model_copy(update={"train": config.train.model_copy(update={"steps": 5})})
    train(longer, resume=run_dir, registry=registry, progress=False)
    run = CALLS["a"][0][1]
    # the last checkpoint is step 3's (the run's end); the first attempt gave the logger step 3's final row last
    assert run.resumed_at == 3 and run.logged_through == 3
    # what it was given at the step run again: the final evaluation's keys (read from the rows the resume dropped)
    assert (
        set(run.already_logged) == {3} and "final" in run.already_logged[3] and "eval/accuracy" in run.already_logged[3]
    )
    assert "reward/mean" not in run.already_logged[3]
    assert run.unlogged(3, {"final": 1.0, "reward/mean": 0.5}) == {"reward/mean": 0.5}
    assert [c[1] for c in CALLS["a"] if c[0] == "metrics"] == [3, 4, 5]
