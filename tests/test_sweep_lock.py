"""One sweep per ``--out`` folder (issue 36): an ``rlzoo ablate`` holds its folder's lock for the sweep's life
(:func:`rlzoo.runtime.runlock.hold_sweep_folder`), so a second sweep there is refused at once, naming the folder and
who holds it, before it builds its grid; a folder refused for another reason stays untouched. Two real concurrent
``rlzoo ablate`` processes: tests/test_fault_table_config.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlzoo.errors import ConfigError, RlzooError
from rlzoo.registry import default_registry
from rlzoo.runtime import runlock
from rlzoo.sweep.ablate import AblateOptions, ablate
from rlzoo.sweep.grid import build_sweep, check_folder, parse_vary

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gspo_tiny_moe.yaml"
ENGINES = ["rollout.engine={name: hf}", "trainer.engine={name: torch}"]

HOLD_SWEEP = """
    import sys, time
    from rlzoo.runtime import runlock
    lock = runlock.hold_sweep_folder(sys.argv[1], "rlzoo ablate holder.yaml")
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def held(tmp_path):
    """A sweep folder another process holds: ``(folder, that process)``."""
    out = tmp_path / "sweep"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD_SWEEP), str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield out, holder
    finally:
        holder.kill()
        holder.wait()


def test_a_held_sweep_folder_is_refused_naming_the_folder_and_its_holder(held):
    out, holder = held
    for attempt in (lambda: runlock.check_sweep_folder(out), lambda: runlock.hold_sweep_folder(out, "second")):
        with pytest.raises(runlock.FolderInUse) as caught:
            attempt()
        message = str(caught.value)
        assert (
            f"sweep folder {out} is in use by another rlzoo process: pid {holder.pid} on host "
            f"{socket.gethostname()} (rlzoo ablate holder.yaml), since 20" in message
        )
        assert f"kill {holder.pid}" in message and "choose another --out" in message
    # the same lock file as a run folder's: a `train` writing there is refused too
    with pytest.raises(runlock.FolderInUse, match="rlzoo ablate holder.yaml"):
        runlock.check_run_folder(out)


def test_the_sweep_folder_is_free_once_its_holder_is_gone(held):
    out, holder = held
    holder.kill()
    holder.wait()
    runlock.check_sweep_folder(out)  # the kernel let the lock go with the process; the file left means nothing


def test_a_second_sweep_is_refused_before_it_builds_its_grid(held):
    out, holder = held
    options = AblateOptions(config="no/such/config.yaml", vary=["trainer.lr=0.1,0.2"], seeds=1, out=out, sets=[])
    with pytest.raises(runlock.FolderInUse, match=f"pid {holder.pid}"):  # not: the config file does not exist
        ablate(options, default_registry())


def test_a_lock_file_alone_does_not_make_the_folder_another_sweeps(tmp_path):
    """A sweep stopped after it took the lock and before it wrote sweep.json leaves only the lock file."""
    out = tmp_path / "sweep"
    out.mkdir()
    (out / runlock.LOCK_NAME).write_text('{"pid": 1}\n')
    sweep = build_sweep(str(EXAMPLE), [parse_vary("trainer.lr=0.1,0.2")], 1, out, ENGINES, default_registry())
    check_folder(sweep)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RlzooError, match="holds no sweep.json"):
        check_folder(sweep)


def test_a_sweep_whose_runs_fail_the_preflight_writes_nothing(tmp_path):
    out = tmp_path / "sweep"
    options = AblateOptions(
        config=str(EXAMPLE),
        vary=["trainer.lr=0.1,0.2"],
        seeds=1,
        out=out,
        sets=[*ENGINES, "task={name: jsonl, path: no/such.jsonl}"],
    )
    with pytest.raises(ConfigError, match="data file not found"):
        ablate(options, default_registry())
    assert not out.exists()  # no lock file either: the folder is claimed only once every run passed
