"""rlzoo.sweep without training: --vary parsing, the grid, the folder claim, CIs and the summary of run folders; what a
rerun keeps (finished runs verified, their checkpoints dropped on request) and how run_local stops its processes."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml
from cli_testlib import CliResult, run_cli

from rlzoo.errors import ConfigError, RlzooError
from rlzoo.registry import default_registry
from rlzoo.sweep.ablate import AblateOptions, ablate, report
from rlzoo.sweep.grid import build_sweep, check_folder, parse_vary, write_manifest
from rlzoo.sweep.jobs import Job
from rlzoo.sweep.stats import mean_ci
from rlzoo.sweep.summary import collect, summarise

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gspo_tiny_moe.yaml"
ENGINES = ["rollout.engine={name: hf}", "trainer.engine={name: torch}"]


def test_parse_vary_keeps_commas_inside_braces():
    vary = parse_vary("rollout.engine={name: hf},{name: vllm, kv_cache_memory_bytes: 1}")
    assert vary.key == "rollout.engine"
    assert vary.values == ("{name: hf}", "{name: vllm, kv_cache_memory_bytes: 1}")
    with pytest.raises(RlzooError, match="seeds"):
        parse_vary("seed=1,2")
    with pytest.raises(RlzooError, match="empty value"):
        parse_vary("trainer.lr=1e-4,")


def test_grid_is_every_combination_times_seeds(tmp_path):
    varies = [parse_vary("algorithm.preset=gspo,grpo"), parse_vary("trainer.lr=0.0001,0.0002")]
    sweep = build_sweep(str(EXAMPLE), varies, 3, tmp_path / "s", ENGINES, default_registry())
    assert len(sweep.runs) == 12 and len(sweep.cells) == 4
    assert {r.seed for r in sweep.runs} == {0, 1, 2}
    run = next(r for r in sweep.runs if r.cell == "preset-grpo_lr-0.0002" and r.seed == 1)
    assert run.config.algorithm.preset == "grpo" and run.config.trainer.lr == 0.0002 and run.config.seed == 1
    assert Path(run.config.output_dir) == tmp_path / "s" / "preset-grpo_lr-0.0002" / "seed1"
    # one cold start per seed, shared by the cells (the algorithm does not change it)
    colds = {r.config.cold_start.output_dir for r in sweep.runs}
    assert len(colds) == 3


def test_sweep_runs_are_grouped_and_tagged_for_experiment_trackers(tmp_path):
    varies = [parse_vary("algorithm.preset=gspo,grpo")]
    sweep = build_sweep(str(EXAMPLE), varies, 2, tmp_path / "s", ENGINES, default_registry())
    run = next(r for r in sweep.runs if r.cell == "preset-grpo" and r.seed == 1)
    tracking = run.config.tracking
    assert tracking.group == "s" and tracking.name == "s/preset-grpo/seed1"
    assert tracking.tags == {"sweep": "s", "cell": "preset-grpo", "seed": "1", "algorithm.preset": "grpo"}
    assert tracking.store_dir == str(tmp_path / "s")  # one local store (MLflow's) for the sweep
    # the user's own settings win, and the names stay distinct per run
    mine = ["tracking.group=mine", "tracking.tags={owner: me, seed: x}", "tracking.store_dir=/tmp/store", *ENGINES]
    sweep = build_sweep(str(EXAMPLE), varies, 2, tmp_path / "t", mine, default_registry())
    names = {r.config.tracking.name for r in sweep.runs}
    assert len(names) == 4
    tracking = sweep.runs[0].config.tracking
    assert tracking.group == "mine" and tracking.store_dir == "/tmp/store"
    assert tracking.tags["owner"] == "me" and tracking.tags["seed"] == "x" and tracking.tags["cell"] == "preset-gspo"


def test_bad_value_in_a_late_cell_is_an_error_before_anything(tmp_path):
    varies = [parse_vary("trainer.lr=0.0001,0.0002"), parse_vary("algorithm.minibatches_per_rollout=1,0")]
    with pytest.raises(
        ConfigError, match="cell lr-0.0002_minibatches_per_rollout-0: algorithm.minibatches_per_rollout"
    ):
        build_sweep(str(EXAMPLE), varies, 2, tmp_path / "s", ENGINES, default_registry())
    assert not (tmp_path / "s").exists()


def test_folder_holding_another_sweep_is_refused(tmp_path):
    registry = default_registry()
    first = build_sweep(str(EXAMPLE), [parse_vary("trainer.lr=0.0001,0.0002")], 2, tmp_path, ENGINES, registry)
    check_folder(first)
    write_manifest(first)
    before = (tmp_path / "sweep.json").read_text()
    check_folder(build_sweep(str(EXAMPLE), [parse_vary("trainer.lr=0.0001,0.0002")], 2, tmp_path, ENGINES, registry))
    for varies, seeds, sets in (
        (["trainer.lr=0.0001,0.0003"], 2, ENGINES),
        (["trainer.lr=0.0001,0.0002"], 3, ENGINES),
        (["trainer.lr=0.0001,0.0002"], 2, [*ENGINES, "train.steps=7"]),
    ):
        other = build_sweep(str(EXAMPLE), [parse_vary(v) for v in varies], seeds, tmp_path, sets, registry)
        with pytest.raises(RlzooError, match="holds a different sweep"):
            check_folder(other)
    assert (tmp_path / "sweep.json").read_text() == before


def test_mean_ci_student_t():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    # s = 1, t_{0.975, 2} = 4.302653
    assert mean == 2.0 and half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert mean_ci([5.0])[0] == 5.0 and math.isnan(mean_ci([5.0])[1])
    assert all(math.isnan(x) for x in mean_ci([]))


def _fake_run(run_dir: Path, seed: int, rewards: list[float], final_acc: float, lr: float) -> None:
    run_dir.mkdir(parents=True)
    rows = [
        {"step": i, "reward/mean": r, "clip/fraction": 0.1 * seed, "time/rollout": 1.0, "time/train": 0.5}
        for i, r in enumerate(rewards)
    ]
    rows[0]["eval/accuracy"] = 0.1
    rows.append({"step": len(rewards), "eval/accuracy": final_acc, "eval/pass@2": final_acc + 0.1, "final": 1.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump({"seed": seed, "output_dir": str(run_dir), "trainer": {"lr": lr}})
    )


def test_compare_loose_run_folders(tmp_path):
    _fake_run(tmp_path / "a0", 0, [0, 0, 0, 0, 1.0], 0.5, 1e-4)
    _fake_run(tmp_path / "a1", 1, [0, 0, 0, 0, 0.0], 0.7, 1e-4)
    _fake_run(tmp_path / "b0", 0, [1, 1, 1, 1, 1.0], 0.9, 2e-4)
    records = collect([tmp_path / "a0", tmp_path / "a1", tmp_path / "b0"])
    rows = {row["cell"]: row for row in summarise(records)}
    assert set(rows) == {"lr=0.0001", "lr=0.0002"}
    a = rows["lr=0.0001"]
    assert a["seeds"] == 2
    assert a["final eval/accuracy"][0] == pytest.approx(0.6)
    assert a["best eval/accuracy"][0] == pytest.approx(0.6)
    assert a["reward/mean (last 20%)"][0] == pytest.approx(0.5)  # last 1 of 5 steps: 1.0 and 0.0
    assert a["clip/fraction"][0] == pytest.approx(0.05)
    assert a["s/step"][0] == pytest.approx(1.5)
    assert a["final eval/pass@2"][0] == pytest.approx(0.7)
    written = report([tmp_path / "a0", tmp_path / "a1", tmp_path / "b0"], tmp_path / "cmp")
    assert [p.name for p in written] == ["summary.csv", "summary.md", "ablation.png"]
    assert "| lr=0.0001 | 2 | 0.6 ± " in (tmp_path / "cmp" / "summary.md").read_text()


def _rlzoo(*args: str, cwd: Path) -> CliResult:
    return run_cli(args, cwd)


def test_cli_bad_input_is_one_line_and_touches_nothing(tmp_path):
    base = ["ablate", str(EXAMPLE), *[x for s in ENGINES for x in ("--set", s)], "--out", str(tmp_path / "s")]
    cases = [
        (["--vary", "algorithm.presett=gspo,grpo"], "algorithm.presett"),
        (["--vary", "algorithm.preset=gspo,grpoo"], "unknown preset 'grpoo'"),
        (["--vary", "algorithm.preset=gspo,grpo", "--vary", "trainer.lr=1e-4,2e-4", "--seeds", "20"], "--max-runs 64"),
        (["--vary", "trainer.lr=1e-4", "--seeds", "3", "--max-runs", "2"], "--yes"),
    ]
    for extra, message in cases:
        result = _rlzoo(*base, *extra, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "s").exists()
    # an --out folder with something else in it
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    result = _rlzoo(*base, "--vary", "trainer.lr=1e-4", "--seeds", "1", cwd=tmp_path)
    assert result.returncode == 1 and "holds no sweep.json" in result.stderr and "Traceback" not in result.stderr
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["notes.txt"]


def test_example_sweep_config_builds_and_preflights(tmp_path):
    from rlzoo.sweep.jobs import plan

    example = REPO / "examples" / "ablate_gspo_vs_grpo.yaml"
    sweep = build_sweep(
        str(example), [parse_vary("algorithm.preset=gspo,grpo")], 2, tmp_path / "s", [], default_registry()
    )
    assert sweep.runs[0].config.train.eval_pass_at_k == [1, 4, 8]
    cold, jobs, done = plan(sweep.runs, default_registry(), threads=1)
    assert (len(cold), len(jobs), done) == (2, 4, [])
    assert all(j.needs is not None for j in jobs)


def test_a_rerun_sweep_resumes_from_each_runs_recorded_config_without_rewriting_it(tmp_path):
    """The same ``ablate`` again on its ``--out`` resumes the unfinished runs: their ``config.yaml`` is the record
    of their first steps and stays byte for byte (rlzoo.preflight.resume_changes); a new run's is written."""
    from rlzoo.config.loading import dump_config
    from rlzoo.sweep.jobs import plan

    sweep = build_sweep(
        str(EXAMPLE), [parse_vary("trainer.lr=1e-4,2e-4")], 1, tmp_path / "s", ENGINES, default_registry()
    )
    started, new = sweep.runs
    recorded = dump_config(started.config) + "# written by the run's first process\n"
    (started.run_dir / "checkpoints" / "step_000001").mkdir(parents=True)
    (started.run_dir / "checkpoints" / "step_000001" / "state.json").write_text("{}")
    (started.run_dir / "checkpoints" / "latest").write_text("step_000001")
    (started.run_dir / "config.yaml").write_text(recorded)
    _, jobs, _ = plan(sweep.runs, default_registry(), threads=1)
    by_name = {job.name: job.args for job in jobs}
    assert by_name[f"{started.cell}/seed0"] == [
        "train",
        str(started.run_dir / "config.yaml"),
        "--resume",
        str(started.run_dir),
    ]
    assert (started.run_dir / "config.yaml").read_text() == recorded
    assert by_name[f"{new.cell}/seed0"] == ["train", str(new.run_dir / "config.yaml")]
    assert (new.run_dir / "config.yaml").read_text() == dump_config(new.config)


def test_unfinished_runs_are_left_out_of_the_table(tmp_path):
    _fake_run(tmp_path / "a0", 0, [0, 0, 1.0], 0.5, 1e-4)
    _fake_run(tmp_path / "a1", 1, [0, 0, 1.0], 0.9, 1e-4)
    path = tmp_path / "a1" / "metrics.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))  # killed before the final eval
    report([tmp_path / "a0", tmp_path / "a1"], tmp_path / "cmp")
    table = (tmp_path / "cmp" / "summary.md").read_text()
    assert "| a0 | 1 | 0.5 |" in table
    assert f"unfinished (1): {tmp_path / 'a1'}" in table


def test_the_gain_against_the_starting_model_is_a_paired_per_run_difference():
    from rlzoo.sweep.summary import RunRecord, run_values

    rows = [
        {"step": 0, "eval/accuracy": 0.25, "reward/mean": 0.2, "response/length_mean": 30.0},
        {"step": 1, "reward/mean": 0.3, "response/length_mean": 20.0},
        {"step": 2, "reward/mean": 0.5, "response/length_mean": 10.0},
        {"step": 2, "eval/accuracy": 0.75, "final": 1.0},
    ]
    values = run_values(RunRecord("cell", Path("."), rows))
    assert values["initial eval/accuracy"] == 0.25 and values["eval/accuracy gain"] == 0.5
    assert values["response/length_mean (first 20%)"] == 30.0 and values["response/length_mean (last 20%)"] == 10.0
    # no evaluation of the starting model (eval_every skips step 0): no gain is claimed
    later = run_values(RunRecord("cell", Path("."), [{**rows[0], "step": 1}, rows[3]]))
    assert "eval/accuracy gain" not in later and "initial eval/accuracy" not in later


# -- a rerun keeps finished runs only once verified; --drop-finished-checkpoints ------------------------------------


def _finished_sweep(out: Path, lrs: str = "1e-4,2e-4,3e-4", steps: int = 4):
    """A sweep whose runs all look finished: the config.yaml the sweep gives each, a row for every step and the
    final evaluation, and a checkpoint."""
    from rlzoo.config.loading import dump_config

    sets = [*ENGINES, f"train.steps={steps}"]
    sweep = build_sweep(str(EXAMPLE), [parse_vary(f"trainer.lr={lrs}")], 1, out, sets, default_registry())
    for run in sweep.runs:
        (run.run_dir / "checkpoints" / f"step_{steps:06d}").mkdir(parents=True)
        (run.run_dir / "checkpoints" / "latest").write_text(f"step_{steps:06d}")
        (run.run_dir / "config.yaml").write_text(dump_config(run.config))
        rows = [{"step": i, "reward/mean": 0.5} for i in range(steps)] + [{"step": steps, "final": 1.0}]
        (run.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return sweep


def _drop_lines(path: Path, steps: set[int]) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if json.loads(line)["step"] not in steps or '"final"' in line))


def test_a_finished_run_is_kept_only_when_its_metrics_and_config_are_this_sweeps(tmp_path):
    from rlzoo.sweep.jobs import plan

    sweep = _finished_sweep(tmp_path / "s")
    good, gappy, other = sweep.runs
    _, jobs, done = plan(sweep.runs, default_registry(), threads=1)
    assert (jobs, [r.cell for r in done]) == ([], [r.cell for r in sweep.runs])  # whole runs: all kept
    _drop_lines(gappy.run_dir / "metrics.jsonl", {1, 3})  # killed and resumed badly, say: steps lost
    config = other.run_dir / "config.yaml"
    config.write_text(config.read_text().replace("lr: 0.0003", "lr: 0.0005"))  # another sweep's run copied in
    with pytest.raises(RlzooError) as caught:
        plan(sweep.runs, default_registry(), threads=1)
    lines = str(caught.value).splitlines()
    assert lines[0].startswith("2 finished run(s) of this sweep cannot be kept")
    assert lines[1] == f"  {gappy.run_dir}: metrics.jsonl lacks steps 1, 3"
    assert lines[2] == (
        f"  {other.run_dir}: config.yaml differs from this sweep's at trainer.lr (the run's 0.0005, the sweep's 0.0003)"
    )
    assert f"delete their folders (rm -r {gappy.run_dir} {other.run_dir})" in lines[3] and len(lines) == 4
    assert str(good.run_dir) not in str(caught.value)


def test_a_finished_runs_metrics_are_checked_against_its_step_count(tmp_path):
    from rlzoo.sweep.finished import metrics_problems

    def problems(steps: list[int], final: int) -> list[str]:
        rows = [{"step": s} for s in steps] + [{"step": final, "final": 1.0}]
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return metrics_problems(tmp_path, 3)

    assert problems([0, 1, 2], 3) == []
    assert problems([0, 1, 1, 2], 3) == ["metrics.jsonl holds step 1 twice"]
    assert problems([0, 2], 3) == ["metrics.jsonl lacks step 1"]
    assert problems([0, 1, 2, 3], 4) == [
        "metrics.jsonl holds steps outside 0..2: 3",
        "metrics.jsonl's final evaluation is at step 4, not once at train.steps 3",
    ]


def _ablate_options(out: Path, **extra) -> AblateOptions:
    sets = [*ENGINES, "train.steps=4"]
    return AblateOptions(str(EXAMPLE), ["trainer.lr=1e-4,2e-4,3e-4"], 1, out, sets, progress=False, **extra)


@pytest.mark.parametrize("drop", [False, True])
def test_drop_finished_checkpoints_removes_those_of_verified_runs_only_when_asked(tmp_path, capsys, drop):
    sweep = _finished_sweep(tmp_path / "s")
    write_manifest(sweep)
    _, status = ablate(_ablate_options(tmp_path / "s", drop_finished_checkpoints=drop), default_registry())
    assert status == {}  # nothing ran: every run was finished
    opening = capsys.readouterr().err
    assert "3 finished and verified, 0 to run" in opening
    assert ("checkpoints dropped (3 now" in opening) == drop
    assert [(r.run_dir / "checkpoints").exists() for r in sweep.runs] == [not drop] * 3
    assert all((r.run_dir / "metrics.jsonl").is_file() for r in sweep.runs)  # the run itself is kept


class _ScriptJob(Job):
    """A job whose process is a short Python script instead of ``rlzoo``: what the backends do around it, fast."""

    script: str = "pass"

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.script]


def test_a_run_that_finishes_during_the_sweep_loses_its_checkpoints_once_verified(tmp_path, capsys):
    from rlzoo.sweep.ablate import _dropping_checkpoints
    from rlzoo.sweep.jobs import job_name
    from rlzoo.sweep.local import run_local
    from rlzoo.sweep.progress import SweepProgress

    sweep = _finished_sweep(tmp_path / "s")  # the runs' processes below "finish" them instantly
    whole, gappy, failed = sweep.runs
    _drop_lines(gappy.run_dir / "metrics.jsonl", {2})
    jobs = [_ScriptJob(job_name(r), [], r.run_dir / "process.log") for r in sweep.runs]
    jobs[2].script = "raise SystemExit(3)"
    (whole.run_dir / "process.log").write_text("$ first start\nrl:  33%|###  | 2/6\r")  # killed mid-line
    on_end = _dropping_checkpoints(sweep.runs, default_registry())
    status = run_local(jobs, 2, SweepProgress(3, 0, "runs", enabled=False), on_end)
    assert status == {job_name(whole): 0, job_name(gappy): 0, job_name(failed): 3}
    commands = [line for line in (whole.run_dir / "process.log").read_text().split("\n") if line.startswith("$ ")]
    assert len(commands) == 2 and sys.executable in commands[1]  # each start on a line of its own
    assert [(r.run_dir / "checkpoints").is_dir() for r in sweep.runs] == [False, True, True]
    assert f"checkpoints kept: {job_name(gappy)} did not finish as verified: metrics.jsonl lacks step 2" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("stop", [RuntimeError, KeyboardInterrupt])
def test_run_local_stops_every_process_it_started_when_it_is_stopped(tmp_path, monkeypatch, stop):
    """Ctrl-C, SIGTERM (rlzoo.cli raises the same KeyboardInterrupt) or an error while runs are going: each process
    is stopped by its PID before the exception leaves, and its log says so."""
    import contextlib
    import os
    import signal
    import time

    from rlzoo.sweep import local
    from rlzoo.sweep.progress import SweepProgress

    monkeypatch.setattr(local, "OWN_STOP_S", 0.2)  # after Ctrl-C runs get a moment to stop by themselves
    pid_files = [tmp_path / f"pid{i}" for i in range(2)]
    jobs = [_ScriptJob(f"job{i}", [], tmp_path / f"job{i}.log") for i in range(2)]
    for job, pid_file in zip(jobs, pid_files):
        job.script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"

    class StoppedWhileRunning(SweepProgress):
        def started(self, job: Job) -> None:
            super().started(job)
            if self.running == 2:  # both runs going
                deadline = time.monotonic() + 60
                while not all(p.is_file() and p.read_text() for p in pid_files) and time.monotonic() < deadline:
                    time.sleep(0.05)
                raise stop("stopped")

    started = time.monotonic()
    try:
        with pytest.raises(stop):
            local.run_local(jobs, 2, StoppedWhileRunning(2, 0, "runs", enabled=False))
        assert time.monotonic() - started < 30
        for pid_file, job in zip(pid_files, jobs):
            with pytest.raises(ProcessLookupError):
                os.kill(int(pid_file.read_text()), 0)
            assert "stopped by the sweep (exit -15)" in job.log.read_text()  # SIGTERM was enough
    finally:  # where run_local failed to, the test stops what it started
        for pid_file in pid_files:
            with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
