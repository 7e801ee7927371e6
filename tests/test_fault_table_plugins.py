"""Components from a script through the real command line: a script clipper trained by ``rlzoo train``, a changed
file refused on ``--resume`` and then allowed, ``rlzoo ablate --vary algorithm.clipper.name=ppo,my-clip --plugin
my_loss.py`` end to end, and the bad inputs (a missing path, a syntax error, a file registering nothing, a clash with
``ppo``) on every command that takes ``--plugin`` or ``plugins:``: exit 1, no traceback, the field and file named.

One tiny run (one step, one checkpoint) is trained once; the resume and the sweep start from it (the sweep from its
cold-start model, so that it builds none). Every command runs in-process through the CLI's entry function, as a new
process would run it (tests/cli_testlib.py), except the sweep (a real ``rlzoo ablate``, marked slow).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cli_testlib import CliResult, run_cli
from test_cli import _rlzoo_command
from test_fault_table import BASE, Case, merge
from test_fault_table import _environment as environment

from rlzoo.reporting.metrics_log import read_metrics

MY_LOSS = '''\
"""A clipper tried from a script."""
import torch

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Sum


@rlzoo.register("clipper", "my-clip")
class MyClip(Clipper):
    """Symmetric clip: loss = -min(rho A, clip(rho, 0.9, 1.1) A)."""

    def clip(self, ratio, advantages):
        self.report("calls", Sum(1.0))  # logged as clip/my-clip/calls: proof that the run used it
        loss = -torch.minimum(ratio * advantages, ratio.clamp(0.9, 1.1) * advantages)
        never = torch.zeros_like(ratio, dtype=torch.bool)
        return ClipResult(loss=loss, clipped_low=never, clipped_high=never)
'''
BROKEN = "import rlzoo\n\ndef clip(:\n    pass\n"  # line 3
EMPTY = '"""Registers nothing."""\nimport rlzoo\n'
CLASH = MY_LOSS.replace('"my-clip"', '"ppo"')


def rlzoo(folder: Path, *argv: str) -> CliResult:
    """``rlzoo *argv`` in ``folder``, in this process as a new one would run it (tests/cli_testlib.py)."""
    return run_cli(argv, folder, environment())


def shown(proc: subprocess.CompletedProcess | CliResult) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


# -- a tiny run with the script clipper ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """``folder/out``: a finished one-step run (checkpoint after step 1) of ``run.yaml``, clipper ``my-clip`` from
    ``./my_loss.py``; the cold start in ``folder/cold``."""
    folder = tmp_path_factory.mktemp("script-run")
    (folder / "my_loss.py").write_text(MY_LOSS)
    extra = {
        "plugins": ["./my_loss.py"],
        "algorithm": {"clipper": {"name": "my-clip"}},
        "cold_start": {"output_dir": str(folder / "cold")},
    }
    (folder / "run.yaml").write_text(yaml.safe_dump(merge(BASE, extra)))
    proc = rlzoo(folder, "train", "run.yaml")
    assert proc.returncode == 0, shown(proc)
    return folder


def test_rlzoo_train_runs_the_script_clipper_and_records_the_file(template):
    rows = read_metrics(template / "out" / "metrics.jsonl")
    assert any(row.get("clip/my-clip/calls", 0) > 0 for row in rows), rows
    script = template / "my_loss.py"
    assert yaml.safe_load((template / "out" / "config.yaml").read_text())["plugins"] == [str(script)]
    assert json.loads((template / "out" / "plugins.json").read_text()) == {str(script): digest(script)}


def test_the_continue_hint_repeats_the_plugin_flags(template):
    """A resume reads the user's config, which does not name a ``--plugin`` file: the hint to continue names it."""
    extra = {
        "algorithm": {"clipper": {"name": "my-clip"}},
        "cold_start": {"output_dir": str(template / "cold")},
        "output_dir": "out-flag",
    }
    (template / "flag.yaml").write_text(yaml.safe_dump(merge(BASE, extra)))
    proc = rlzoo(template, "train", "flag.yaml", "--plugin", "my_loss.py")
    assert proc.returncode == 0, shown(proc)
    assert "(continue: rlzoo train flag.yaml --plugin my_loss.py --resume out-flag)" in proc.stdout, shown(proc)


def test_a_changed_file_is_refused_on_resume_and_goes_ahead_with_allow_changes(template):
    run, script = template / "run-resumed", template / "my_loss.py"
    shutil.copytree(template / "out", run)
    before = digest(script)
    original = script.read_text()
    script.write_text(original.replace("0.9, 1.1", "0.8, 1.2"))
    after = digest(script)
    try:
        refused = rlzoo(template, "train", "run.yaml", "--resume", "run-resumed", "--set", "train.steps=2")
        allowed = rlzoo(
            template,
            "train",
            "run.yaml",
            "--resume",
            "run-resumed",
            "--set",
            "train.steps=2",
            "--allow-changes",
            "plugins",
        )
    finally:
        script.write_text(original)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, shown(refused)
    assert [line for line in refused.stderr.splitlines() if line.startswith("error:")] == ["error: invalid config:"]
    assert (
        f"  plugins: {script} changed since the run started (sha256 {before[7:19]}... -> {after[7:19]}...); a "
        "resume runs the code the run ran"
    ) in refused.stderr, shown(refused)
    assert "--allow-changes plugins" in refused.stderr
    assert allowed.returncode == 0, shown(allowed)
    assert f"changes going ahead, recorded in run-resumed/config_changes.jsonl: plugins.{script}" in allowed.stdout
    [row] = [json.loads(line) for line in (run / "config_changes.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["changes"][f"plugins.{script}"] == [before, after]
    assert json.loads((run / "plugins.json").read_text()) == {str(script): after}
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "reward/mean" in r] == [0, 1]


@pytest.mark.slow  # a whole sweep; `rlzoo train` with the script runs by default (above)
def test_rlzoo_ablate_varies_a_builtin_against_the_script_end_to_end(template):
    sweep_config = merge(BASE, {"model": {"path": str(template / "cold")}})  # the template's cold-start model
    (template / "sweep.yaml").write_text(yaml.safe_dump(sweep_config))
    proc = subprocess.run(
        [
            *_rlzoo_command(),
            "ablate",
            "sweep.yaml",
            "--vary",
            "algorithm.clipper.name=ppo,my-clip",
            "--plugin",
            "my_loss.py",
            "--seeds",
            "1",
            "--jobs",
            "2",
            "--out",
            "sweep",
        ],
        cwd=template,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, shown(proc)
    sweep = template / "sweep"
    table = (sweep / "summary.md").read_text()
    assert "| name-ppo | 1 |" in table and "| name-my-clip | 1 |" in table, table
    for cell, uses_script in (("name-ppo", False), ("name-my-clip", True)):
        run = sweep / cell / "seed0"
        assert yaml.safe_load((run / "config.yaml").read_text())["plugins"] == [str(template / "my_loss.py")]
        rows = read_metrics(run / "metrics.jsonl")
        assert rows[-1]["final"] == 1.0
        assert any("clip/my-clip/calls" in row for row in rows) == uses_script, (cell, rows)
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert manifest["plugins"] == {str(template / "my_loss.py"): digest(template / "my_loss.py")}


# -- bad input, on every command that takes --plugin -----------------------------------------------------------


def case(files: dict[str, str], *argv: str, extra: dict | None = None):
    def setup(folder: Path, ctx) -> list[str]:
        for name, text in files.items():
            (folder / name).write_text(text)
        (folder / "run.yaml").write_text(yaml.safe_dump(merge(BASE, extra or {})))
        return [part if part != "CONFIG" else "run.yaml" for part in argv]

    return setup


CASES = [
    Case(
        "check-with-the-flag",
        case(
            {"my_loss.py": MY_LOSS},
            "config",
            "check",
            "CONFIG",
            "--plugin",
            "my_loss.py",
            "--set",
            "algorithm.clipper.name=my-clip",
        ),
        ("my_loss.py\n", "clipper:\n    name: my-clip"),
        code=0,
        one_error=False,
    ),
    Case(
        "plugins-list-with-the-flag",
        case({"my_loss.py": MY_LOSS}, "plugins", "list", "--plugin", "my_loss.py"),
        ("my-clip", "script my_loss.py", "Symmetric clip"),
        code=0,
        one_error=False,
    ),
    Case(
        "missing-path-in-the-config",
        case({}, "config", "check", "CONFIG", extra={"plugins": ["./nope.py"]}),
        ("run.yaml", "plugins.0: ./nope.py does not exist ("),
    ),
    Case(
        "missing-path-train",
        case({}, "train", "CONFIG", "--plugin", "nope.py"),
        ("--plugin: nope.py does not exist (",),
    ),
    Case(
        "missing-path-sft",
        case({}, "sft", "CONFIG", "--plugin", "lib/nope.py"),
        ("--plugin: lib/nope.py does not exist",),
    ),
    Case(
        "syntax-error-in-the-config",
        case({"broken.py": BROKEN}, "train", "CONFIG", extra={"plugins": ["broken.py"]}),
        ("plugins.0: broken.py, line 3: SyntaxError: invalid syntax",),
        once="line 3",
        absent=("File ",),
    ),
    Case(
        "syntax-error-ablate",
        case(
            {"broken.py": BROKEN},
            "ablate",
            "CONFIG",
            "--plugin",
            "broken.py",
            "--vary",
            "trainer.lr=0.1,0.2",
            "--seeds",
            "1",
            "--out",
            "sweep",
        ),
        ("--plugin: broken.py, line 3: SyntaxError: invalid syntax",),
        once="line 3",
    ),
    Case(
        "registers-nothing-check",
        case({"empty.py": EMPTY}, "config", "check", "CONFIG", "--plugin", "empty.py"),
        (
            "--plugin: empty.py registers no component: give it module-level @rlzoo.hookimpl functions",
            '@rlzoo.register("clipper", "my-clip")',
        ),
    ),
    Case(
        "registers-nothing-plugins-list",
        case({"empty.py": EMPTY}, "plugins", "list", "--plugin", "empty.py"),
        ("--plugin: empty.py registers no component",),
    ),
    Case(
        "clash-with-ppo",
        case({"clash.py": CLASH}, "train", "CONFIG", extra={"plugins": ["./clash.py"]}),
        (
            "algorithm.clipper: clipper 'ppo' is registered twice: by rlzoo-estimators (plugin 'estimators') and by "
            "script clash.py (plugin '",
            "clash.py'). Uninstall one of the two distributions (or drop the script from plugins)",
        ),
    ),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[Path, CliResult]]:
    jobs = [(c, tmp_path_factory.mktemp(c.id)) for c in CASES]
    return {c.id: (folder, rlzoo(folder, *c.setup(folder, None))) for c, folder in jobs}


@pytest.mark.parametrize("bad", CASES, ids=lambda c: c.id)
def test_plugin_input_through_the_real_cli(results, bad: Case):
    folder, proc = results[bad.id]
    output = proc.stdout + proc.stderr
    assert proc.returncode == bad.code, shown(proc)
    assert "Traceback" not in output, shown(proc)
    for text in bad.expect:
        assert text in output, f"{text!r} missing; {shown(proc)}"
    for text in bad.absent:
        assert text not in output, f"{text!r} present; {shown(proc)}"
    if bad.once is not None:
        assert output.count(bad.once) == 1, shown(proc)
    if bad.one_error:
        assert len([line for line in output.splitlines() if line.startswith("error:")]) == 1, shown(proc)
        assert not (folder / "out").exists() and not (folder / "sweep").exists()  # refused before any file
