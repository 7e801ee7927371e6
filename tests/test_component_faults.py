"""A component that raises where rlzoo calls it (issue 52): in its ``preflight`` (``rlzoo config check``) or in its
method in the middle of ``rlzoo train``. Either is one line naming the component as the registry does (kind, name,
distribution: ``script boom_*.py`` for a script), its file and line, and the exception; exit 1, the traceback in the
log (``log.txt`` for a run, the console with ``--verbose``), a run's last checkpoint intact. The mechanism:
:func:`rlzoo.component_errors.component_raised` / :func:`~rlzoo.component_errors.raising_component`, used by the preflight's
component rule and by :func:`rlzoo.runtime.faults.component_failure`. In-process, through ``rlzoo.cli.main``."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
import yaml

from rlzoo.cli import main

BASE = {
    "output_dir": "out",
    "rollout": {"engine": {"name": "hf"}, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
    "trainer": {"engine": {"name": "torch"}},
    "cold_start": {"steps": 2, "batch_size": 8, "examples": 32},
    "train": {"steps": 2, "eval_every": 5, "eval_prompts": 4, "checkpoint_every": 1},
}
CLIPPER = '''\
"""A clipper that breaks: in its preflight, or in clip once the file FLAG exists."""
from pathlib import Path

import torch

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult


@rlzoo.register("clipper", "NAME")
class Boom(Clipper):
    def preflight(self, run, at):
        if PREFLIGHT:
            raise RuntimeError("no GPU here")
        return super().preflight(run, at)

    def clip(self, ratio, advantages):
        if Path("FLAG").exists():
            {}["missing"]  # line 19: a KeyError in the middle of a step
        never = torch.zeros_like(ratio, dtype=torch.bool)
        return ClipResult(loss=-ratio * advantages, clipped_low=never, clipped_high=never)
'''


@pytest.fixture(autouse=True)
def _scripts_forgotten_afterwards(tmp_path):
    """The script components a test loads leave the process's registry after it, as in a new process (the CLI
    tables that run later list the installed components only)."""
    from rlzoo import local_plugins
    from rlzoo.registry import default_registry, forget_marks

    modules, scripts = set(sys.modules), dict(local_plugins._LOADED)
    yield
    default_registry.cache_clear()
    local_plugins._LOADED.clear()
    local_plugins._LOADED.update(scripts)
    for name in set(sys.modules) - modules:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path) + os.sep):
            del sys.modules[name]
            forget_marks(name)


def script(folder: Path, name: str, preflight: bool) -> str:
    """``folder/<name>.py``, a clipper registered as ``name`` (a name per test: the registry is the process's)."""
    (folder / f"{name}.py").write_text(
        CLIPPER.replace("NAME", name).replace("PREFLIGHT", str(preflight)).replace("FLAG", str(folder / "boom.flag"))
    )
    config = {
        **BASE,
        "algorithm": {"clipper": {"name": name}},
        "cold_start": {**BASE["cold_start"], "output_dir": str(folder / "cold")},
    }
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    return f"{name}.py"


def one_error(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err, captured
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, captured
    return captured.err


def test_a_preflight_that_raises_is_one_line_naming_the_component_and_its_file(tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.chdir(tmp_path)
    plugin = script(tmp_path, "boom_preflight", preflight=True)
    with caplog.at_level(logging.INFO, logger="rlzoo.preflight.rules"):
        assert main(["config", "check", "run.yaml", "--plugin", plugin]) == 1
    err = one_error(capsys)
    assert (
        "  algorithm.clipper: clipper 'boom_preflight' (script boom_preflight.py) raised RuntimeError: no GPU here "
        "in preflight (boom_preflight.py, line 14)"
    ) in err, err
    [record] = [r for r in caplog.records if "algorithm.clipper's preflight" in r.getMessage()]
    assert record.levelno == logging.INFO and record.exc_info[0] is RuntimeError  # the traceback: log / --verbose


def test_any_components_preflight_is_held_alike(tmp_path, monkeypatch, capsys):
    """An installed component's (here a first-party one's, made to raise): named with its distribution."""
    from rlzoo_estimators.advantages.gdpo import GDPOAdvantage

    def broken(self, run, at):
        return [(at, "never")] if self.params.eps < 0 else 1 / 0

    monkeypatch.setattr(GDPOAdvantage, "preflight", broken)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({**BASE, "algorithm": {"advantage": {"name": "gdpo"}}}))
    assert main(["config", "check", "run.yaml"]) == 1
    err = one_error(capsys)
    # its method lives in this file, not in the class's: the frame of the component's own method is named
    assert (
        "  algorithm.advantage: advantage 'gdpo' (rlzoo-estimators) raised ZeroDivisionError: division by zero in "
        f"broken ({__file__}, line"
    ) in err, err


def test_a_component_that_raises_mid_run_ends_train_in_one_line_its_checkpoint_intact(tmp_path, monkeypatch, capsys):
    from rlzoo.runtime import run as run_module
    from rlzoo.runtime.checkpoint.digests import verify_checkpoint

    monkeypatch.chdir(tmp_path)
    plugin = script(tmp_path, "boom_step", preflight=False)
    save = run_module.save_checkpoint

    def save_then_break(*args, **kwargs):  # the clipper raises from the step after the first checkpoint
        save(*args, **kwargs)
        (tmp_path / "boom.flag").touch()

    monkeypatch.setattr(run_module, "save_checkpoint", save_then_break)
    assert main(["train", "run.yaml", "--plugin", plugin]) == 1
    err = one_error(capsys)
    checkpoint = Path("out") / "checkpoints" / "step_000001"
    expected = (
        f"error: stopped at step 1: clipper 'boom_step' (script boom_step.py) raised KeyError: 'missing' in clip "
        f"(boom_step.py, line 19); its traceback is in the run's log.txt; the last checkpoint, {checkpoint}, is "
        "intact: fix the cause, then continue with `rlzoo train CONFIG --resume out`"
    )
    assert expected in err, err
    log = (tmp_path / "out" / "log.txt").read_text()
    assert "the traceback of that failure" in log and 'Traceback (most recent call last)' in log
    assert '{}["missing"]' in log  # the script's own line, in the traceback
    check = verify_checkpoint(tmp_path / checkpoint)
    assert check.intact and check.verified, check.problems
    assert (tmp_path / "out" / "checkpoints" / "latest").read_text().strip() == "step_000001"


def test_only_a_registered_components_exception_is_named(tmp_path):
    """rlzoo's own bugs (outside any component, or in a base class's default instance) and its own user-facing
    errors keep their way out: the traceback, or the message as it is."""
    from rlzoo.errors import RlzooError
    from rlzoo.interfaces import RouterPolicy
    from rlzoo.registry import default_registry
    from rlzoo.runtime.faults import component_failure

    registry = default_registry()

    def raised(call) -> Exception:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the exception under test
            return exc
        raise AssertionError("did not raise")

    class Unnamed(RouterPolicy):  # a component no registry knows
        def replays_routing(self) -> bool:
            raise ValueError("internal")

    assert component_failure(raised(lambda: 1 / 0), registry, tmp_path, 3) is None
    assert component_failure(raised(Unnamed().replays_routing), registry, tmp_path, 3) is None
    gdpo = registry.create("advantage", "gdpo", {})
    assert component_failure(raised(lambda: gdpo.compute(None)), registry, tmp_path, 3) is not None

    class Telling(type(gdpo)):
        def compute(self, batch):
            raise RlzooError("already clear")

    assert component_failure(raised(lambda: Telling().compute(None)), registry, tmp_path, 3) is None
    failure = component_failure(raised(lambda: gdpo.compute(None)), registry, tmp_path, None)
    assert str(failure).startswith(
        "stopped while the run was set up: advantage 'gdpo' (rlzoo-estimators) raised "
        "AttributeError: 'NoneType' object has no attribute 'reward_parts' in compute ("
    )
    assert str(failure).endswith("no checkpoint had been written yet")


TASK = '''\
"""A task whose training samples break: rlzoo sft reads them to build the cold start."""
import rlzoo
from rlzoo.interfaces import Sample, Task


@rlzoo.register("task", "NAME")
class Broken(Task):
    default_verifier = "exact"

    def samples(self, split, count, seed):
        if split == "train":
            raise ValueError("the data file is gone")  # line 12
        return [Sample(prompt="1+1=", answer="2", demonstration="2")] * (count or 4)

    def alphabet(self):
        return "0123456789+="
'''


def test_a_component_raising_in_sft_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """``rlzoo sft`` runs components outside a training run (the task's samples, for the cold start): the same
    one line naming the component, its file and line, and the exception; the traceback in the log."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_task.py").write_text(TASK.replace("NAME", "broken-task-sft"))
    config = {
        **BASE,
        "task": {"name": "broken-task-sft"},
        "cold_start": {**BASE["cold_start"], "output_dir": str(tmp_path / "cold")},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    assert main(["sft", "run.yaml", "--plugin", "broken_task.py"]) == 1
    err = one_error(capsys)
    assert (
        "task 'broken-task-sft' (script broken_task.py) raised ValueError: the data file is gone in samples "
        "(broken_task.py, line 12)"
    ) in err, err
    assert "Traceback" in (tmp_path / "out" / "log.txt").read_text()
