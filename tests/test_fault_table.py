"""The fault table: what a hostile-but-realistic user does wrong, through the real CLI.

Each case of :data:`CASES` runs ``rlzoo ...`` through the CLI's entry function in this process, as a new process
would run it (tests/cli_testlib.py; the few marked ``subprocess`` as a real ``rlzoo`` process, for the exit path),
one after the other in one fixture, and must end with its exit code (1 for an error; 0 where rlzoo goes on with a
warning), no traceback, and the field or the file (and line or row) named once in what it prints. The rows: output
folders, data files, over-long prompts, YAML keys, torn metrics lines, damaged checkpoints, run folders in use,
resumes with a changed config, non-finite and out-of-range numbers. The cases that resume start from a copy of one
finished tiny run (two checkpoints), made once. The rules behind them are also tested in-process below and beside
their modules (fast), the permission rules with ``os.access`` stubbed so that they hold as root too.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from cli_testlib import CliResult, run_cli
from test_cli import _rlzoo_command

BASE = {
    "output_dir": "out",
    "rollout": {"engine": {"name": "hf"}, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
    "trainer": {"engine": {"name": "torch"}},
    "cold_start": {"steps": 2, "batch_size": 8, "examples": 32},
    "train": {"steps": 1, "eval_every": 1, "eval_prompts": 4, "checkpoint_every": 1},
}
LONG_PROMPT = "1" * 2_000_000 + "+1="  # two million tokens for the character tokenizer; the context is 256


# -- making a folder this user cannot write to ---------------------------------------------------------------


def _lock(folder: Path) -> Callable[[], None] | None:
    """Make ``folder`` unwritable for this user; return the undo, or ``None`` when it cannot be done. chmod does not
    stop root, so as root the folder is made immutable (``chattr +i``, ext4 and friends) where that is allowed."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode != 0:
        return None
    if os.access(folder, os.W_OK):  # the flag is set, but this kernel does not refuse root for it
        subprocess.run([chattr, "-i", str(folder)], capture_output=True)
        return None
    return lambda: subprocess.run([chattr, "-i", str(folder)], capture_output=True)


def _can_lock() -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe"
        probe.mkdir()
        undo = _lock(probe)
        if undo is None:
            return False
        undo()
        return True


CAN_LOCK = _can_lock()
NO_LOCK = (
    "running as root, where chmod does not stop writes, and chattr +i is not available here (no chattr, no "
    "CAP_LINUX_IMMUTABLE or a file system without the flag): a folder root cannot write to cannot be made"
)


# -- the cases ---------------------------------------------------------------------------------------------------


@dataclass
class Context:
    """What a case's setup may use: ``template``, a finished tiny run to copy (its config ``run.yaml``, its folder
    ``run`` with checkpoints after steps 1 and 2); ``undo``, where it leaves what to undo once every case ran (a
    folder made unwritable, a process holding a run folder)."""

    template: Path
    undo: list = field(default_factory=list)


@dataclass
class Case:
    """``setup(folder, ctx)`` writes the case's files into ``folder`` and returns the arguments after ``rlzoo``.
    Every text of ``expect`` must appear in the output, ``once`` exactly once, none of ``absent``."""

    id: str
    setup: Callable[[Path, Context], list[str]]
    expect: tuple[str, ...]
    code: int = 1
    once: str | None = None
    absent: tuple[str, ...] = ()
    locks: bool = False  # needs a folder made unwritable (skipped where that cannot be done)
    one_error: bool = True  # exit 1 with a single `error:` line
    subprocess: bool = False  # run as a real `rlzoo` process (seconds importing torch) instead of in this one


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def config(folder: Path, extra: dict | None = None, text: str | None = None) -> str:
    (folder / "run.yaml").write_text(text if text is not None else yaml.safe_dump(merge(BASE, extra or {})))
    return "run.yaml"


def rows_jsonl(n: int = 12) -> list[str]:
    return [json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i), "demonstration": str(2 * i)}) for i in range(n)]


def data_file(folder: Path, name: str, lines: list[str], raw: dict[int, bytes] | None = None) -> str:
    """``lines`` as a file, line ``i`` (1-based) replaced by the bytes ``raw[i]``."""
    data = [raw[i].rstrip(b"\n") if raw and i in raw else line.encode() for i, line in enumerate(lines, start=1)]
    (folder / name).write_bytes(b"\n".join(data) + b"\n")
    return name


def with_task(task: str, path: str, command: str = "train") -> Callable[[Path, Context], list[str]]:
    def setup(folder: Path, ctx: Context) -> list[str]:
        args = ["config", "check"] if command == "check" else [command]
        return [*args, config(folder, {"task": {"name": task, "path": path}})]

    return setup


def check(extra: dict, command: str = "check") -> Callable[[Path, Context], list[str]]:
    def setup(folder: Path, ctx: Context) -> list[str]:
        (folder / "afile").write_text("not a folder\n")
        return [*(["config", "check"] if command == "check" else [command]), config(folder, extra)]

    return setup


def locked(output_dir: str, command: str) -> Callable[[Path, Context], list[str]]:
    def setup(folder: Path, ctx: Context) -> list[str]:
        (folder / "locked").mkdir()
        ctx.undo.append(_lock(folder / "locked"))
        return [*(["config", "check"] if command == "check" else [command]), config(folder, {"output_dir": output_dir})]

    return setup


def bad_data(
    name: str, task: str, raw: dict[int, bytes], command: str = "train"
) -> Callable[[Path, Context], list[str]]:
    def setup(folder: Path, ctx: Context) -> list[str]:
        data_file(folder, name, rows_jsonl(), raw)
        return with_task(task, name, command)(folder, ctx)

    return setup


def bad_json_document(folder: Path, ctx: Context) -> list[str]:
    records = [json.loads(line) for line in rows_jsonl()]
    text = json.dumps(records, indent=1).splitlines()
    text[2] = text[2].replace('",', '"')  # line 3 loses its comma: the parser finds out on line 4
    (folder / "doc.json").write_text("\n".join(text) + "\n")
    return ["train", config(folder, {"task": {"name": "dataset", "path": "doc.json"}})]


def bad_utf8_parquet(folder: Path, ctx: Context) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompts = [f"{i}+{i}=".encode() for i in range(12)]
    prompts[2] = b"2+\xff="  # row 3
    binary = pa.array(prompts, type=pa.binary())
    strings = pa.Array.from_buffers(pa.string(), len(prompts), binary.buffers())  # the bytes, unchecked, as strings
    pq.write_table(pa.table({"prompt": strings, "answer": [str(2 * i) for i in range(12)]}), folder / "bad.parquet")
    return ["train", config(folder, {"task": {"name": "dataset", "path": "bad.parquet"}})]


def long_prompt(name: str, task: str, command: str) -> Callable[[Path, Context], list[str]]:
    def setup(folder: Path, ctx: Context) -> list[str]:
        lines = rows_jsonl(30)
        lines.insert(3, json.dumps({"prompt": LONG_PROMPT, "answer": "2", "demonstration": "2"}))  # line 4
        if name.endswith(".jsonl"):
            (folder / name).write_text("\n".join(lines) + "\n")
        elif name.endswith(".json"):
            (folder / name).write_text(json.dumps([json.loads(line) for line in lines]))
        else:
            import datasets

            datasets.Dataset.from_list([json.loads(line) for line in lines]).to_parquet(str(folder / name))
            # a separate eval file: the cold start draws its examples from all the train prompts, the long one too
            evals = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(50, 60)]
            (folder / "eval.jsonl").write_text("\n".join(evals) + "\n")
            return [command, config(folder, {"task": {"name": task, "path": name, "eval_path": "eval.jsonl"}})]
        return with_task(task, name, command)(folder, ctx)

    return setup


DUPLICATE_TOP = """\
output_dir: out
trainer:
  lr: 1.0e-3
rollout: {engine: {name: hf}, max_new_tokens: 4}
trainer:
  engine: {name: torch}
"""
DUPLICATE_NESTED = """\
output_dir: out
rollout: {engine: {name: hf}, max_new_tokens: 4}
trainer:
  engine: {name: torch}
  lr: 1.0e-3
  lr: 2.0e-3
"""


def yaml_file(text: str, *command: str) -> Callable[[Path, Context], list[str]]:
    def setup(folder: Path, ctx: Context) -> list[str]:
        (folder / "run.yaml").write_text(text)
        return (
            [*command, "run.yaml"]
            if command[0] != "ablate"
            else ["ablate", "run.yaml", "--vary", "trainer.lr=0.1,0.2", "--seeds", "1", "--out", "sweep"]
        )

    return setup


METRICS = [
    {"step": 0, "eval/accuracy": 0.25},
    {"step": 1, "reward/mean": 0.5, "time/train": 1.0},
    {"step": 2, "reward/mean": 0.75, "time/train": 1.0},
    {"step": 2, "eval/accuracy": 0.5, "final": 1.0},
]


def metrics_run(torn_line: int | None, command: str) -> Callable[[Path, Context], list[str]]:
    """A run folder whose metrics.jsonl has a torn line at ``torn_line`` (1-based), or at its end (``None``: a write
    cut short by a crash, no newline after it)."""

    def setup(folder: Path, ctx: Context) -> list[str]:
        lines = [json.dumps(r) for r in METRICS]
        torn, last = '{"step": 1, "reward/me', torn_line is None
        lines = lines + [torn] if last else lines[: torn_line - 1] + [torn] + lines[torn_line - 1 :]
        (folder / "run").mkdir()
        (folder / "run" / "metrics.jsonl").write_text("\n".join(lines) + ("" if last else "\n"))
        return [command, "run"]

    return setup


# -- a finished run to damage, hold, or resume differently -----------------------------------------------------

TEMPLATE = {"output_dir": "run", "train": {"steps": 2, "eval_every": 2, "keep_checkpoints": 3}}


def make_template(folder: Path) -> Path:
    """A finished two-step run in ``folder/run`` (checkpoints after steps 1 and 2), from ``folder/run.yaml``."""
    config(folder, merge(TEMPLATE, {"cold_start": {"output_dir": str(folder / "cold")}}))
    proc = run_cli(["train", "run.yaml"], folder, _environment())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def copied_run(folder: Path, ctx: Context) -> Path:
    shutil.copy(ctx.template / "run.yaml", folder / "run.yaml")
    shutil.copytree(ctx.template / "run", folder / "run")
    return folder / "run"


def checkpoint_file(run: Path, step: int, name: str) -> Path:
    return run / "checkpoints" / f"step_{step:06d}" / name


def truncate(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def flip(path: Path) -> None:
    """256 bytes flipped in the middle of a safetensors file's tensor data: it still loads; only its digest tells."""
    data = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0]
    start += max(0, (len(data) - start - 256) // 2)
    for i in range(start, min(start + 256, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def resume_damaged(*damage: tuple[int, str, Callable[[Path], None]], extra: tuple[str, ...] = ()):
    def setup(folder: Path, ctx: Context) -> list[str]:
        run = copied_run(folder, ctx)
        for step, name, how in damage:
            how(checkpoint_file(run, step, name))
        return ["train", "run.yaml", "--resume", "run", *extra]

    return setup


def resume_with(*arguments: str):
    def setup(folder: Path, ctx: Context) -> list[str]:
        copied_run(folder, ctx)
        return ["train", "run.yaml", "--resume", "run", *arguments]

    return setup


HOLD = """
    import sys, time
    from rlzoo.runtime import runlock
    lock = runlock.hold_run_folder(sys.argv[1], "holder-command")
    print("held", flush=True)
    time.sleep(600)
"""


def in_use(*command: str, copy: bool = False):
    """Another process holds the run folder (``out``, or a copy of the template run) while ``command`` runs."""

    def setup(folder: Path, ctx: Context) -> list[str]:
        held = copied_run(folder, ctx) if copy else folder / "out"
        if not copy:
            config(folder)
        holder = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(HOLD), str(held)], stdout=subprocess.PIPE, text=True
        )
        ctx.undo.append(holder.kill)
        assert holder.stdout.readline().strip() == "held"
        return [*command, "run.yaml", *(["--resume", "run"] if copy else [])]

    return setup


def sets(*overrides: str, command: tuple[str, ...] = ("config", "check")):
    def setup(folder: Path, ctx: Context) -> list[str]:
        return [*command, config(folder), *[a for o in overrides for a in ("--set", o)]]

    return setup


def resume_missing(folder: Path, ctx: Context) -> list[str]:
    return ["train", config(folder), "--resume", "nowhere"]


def resume_without_checkpoint(folder: Path, ctx: Context) -> list[str]:
    run = copied_run(folder, ctx)
    shutil.rmtree(run / "checkpoints")
    return ["train", "run.yaml", "--resume", "run"]


NONFINITE = """\
output_dir: out
rollout: {engine: {name: hf}, max_new_tokens: 4}
trainer: {engine: {name: torch}}
algorithm: {clipper: {name: ppo, eps_low: .nan}}
"""


CASES = [
    # 1. output folder problems: config check, and train's preflight
    Case(
        "output-dir-is-a-file-check",
        check({"output_dir": "afile"}),
        ("output_dir: afile is a file, not a folder", "choose another output_dir"),
    ),
    Case(
        "output-dir-is-a-file-train",
        check({"output_dir": "afile"}, "train"),  # train's exit path, for real
        ("output_dir: afile is a file, not a folder", "choose another output_dir"),
        subprocess=True,
    ),
    Case(
        "output-dir-under-a-file",
        check({"output_dir": "afile/run"}),
        ("output_dir: afile/run cannot be made:", "afile is a file, not a folder"),
    ),
    Case(
        "cold-start-dir-is-a-file",
        check({"cold_start": {"output_dir": "afile"}}),
        ("cold_start.output_dir: afile is a file, not a folder",),
    ),
    Case(
        "output-dir-not-writable-check",
        locked("locked", "check"),
        ("output_dir: locked is a folder this user cannot write to",),
        locks=True,
    ),
    Case(
        "output-dir-parent-not-writable",
        locked("locked/new/run", "check"),
        ("output_dir: locked/new/run cannot be made: its parent folder", "locked is not writable"),
        locks=True,
    ),
    # 2. data files: decoding and parse errors name the file and the 1-based line (or row), once
    Case(
        "jsonl-task-not-utf8",
        bad_data("bad.jsonl", "jsonl", {3: b'{"prompt": "2+\xff=", "answer": "4"}'}),
        ("error: bad.jsonl, line 3: not valid UTF-8",),
        once="line 3",
    ),
    Case(
        "jsonl-task-malformed-line",
        bad_data("bad.jsonl", "jsonl", {3: b'{"prompt": "2+2=", "answer": "4"'}),
        ("error: bad.jsonl, line 3: invalid JSON",),
        once="line 3",
    ),
    Case(
        "dataset-task-not-utf8",
        bad_data("bad.jsonl", "dataset", {3: b'{"prompt": "2+\xff=", "answer": "4"}'}),
        ("error: bad.jsonl, line 3: not valid UTF-8",),
        once="line 3",
        absent=("UnicodeDecodeError",),
    ),
    Case(
        "dataset-task-malformed-line",
        bad_data("bad.jsonl", "dataset", {3: b'{"prompt": "2+2=", "answer": "4"'}),
        ("error: bad.jsonl, line 3: invalid JSON",),
        once="line 3",
        absent=("Failed to load JSON", "row 2", "DatasetGenerationError"),
    ),
    Case(
        "dataset-task-malformed-json-document",
        bad_json_document,
        ("error: doc.json, line 4: invalid JSON: Expecting ',' delimiter",),
        once="line 4",
        absent=("Failed to load JSON",),
    ),
    Case(
        "dataset-task-parquet-not-utf8",
        bad_utf8_parquet,
        ("error: bad.parquet, row 3: a string that is not valid UTF-8",),
        once="row 3",
    ),
    # 3. prompts longer than the model's context
    Case(
        "long-prompt-jsonl-check",
        long_prompt("long.jsonl", "jsonl", "check"),
        (
            "task.path: long.jsonl, line 4: a prompt of 2,000,003 characters",
            "256-token context",
            "prompt.max_prompt_tokens (at most 252)",
        ),
    ),
    Case(
        "long-prompt-dataset-json-check",
        long_prompt("long.json", "dataset", "check"),
        ("task.path: long.json, row 4: a prompt of 2,000,003 characters",),
    ),
    Case(
        "long-prompt-parquet-cold-start",
        long_prompt("long.parquet", "dataset", "sft"),  # not measured: dropped
        ("cold-start split: 1 of 32 prompts are longer than the 252 tokens the model's context leaves", "are dropped"),
        code=0,
        one_error=False,
    ),
    # 4. a key given twice in a YAML mapping
    Case(
        "duplicate-top-level-key-check",
        yaml_file(DUPLICATE_TOP, "config", "check"),
        ("run.yaml", "trainer: duplicate key 'trainer' at line 5 (first at line 2)"),
    ),
    Case(
        "duplicate-nested-key-train",
        yaml_file(DUPLICATE_NESTED, "train"),
        ("run.yaml", "trainer.lr: duplicate key 'lr' at line 6 (first at line 5)"),
    ),
    Case(
        "duplicate-key-ablate",
        yaml_file(DUPLICATE_NESTED, "ablate"),
        ("run.yaml", "trainer.lr: duplicate key 'lr' at line 6 (first at line 5)"),
    ),
    # 5. a torn metrics line: skipped with a warning in the middle, quietly at the end
    Case(
        "compare-torn-middle-line",
        metrics_run(3, "compare"),
        ("run/metrics.jsonl, line 3: not a whole JSON object", "run/summary.md"),
        code=0,
        once="line 3",
        one_error=False,
    ),
    Case(
        "plot-torn-middle-line",
        metrics_run(3, "plot"),
        ("run/metrics.jsonl, line 3: not a whole JSON object", "run/curves.png"),
        code=0,
        once="line 3",
        one_error=False,
    ),
    Case(
        "compare-torn-last-line",
        metrics_run(None, "compare"),
        ("run/summary.md",),
        code=0,
        absent=("WARNING", "line 5"),
        one_error=False,
    ),
    # 6. damaged checkpoints: named file by file; the newest intact one is resumed, or nothing is
    Case(
        "resume-latest-weights-truncated",
        resume_damaged((2, "model/model.safetensors", truncate)),
        (
            "checkpoint run/checkpoints/step_000002 is damaged",
            "model/model.safetensors: truncated (",
            "resuming from run/checkpoints/step_000001, the newest intact checkpoint, so step 1 is run again",
        ),
        code=0,
        one_error=False,
    ),
    Case(
        "resume-latest-optimizer-flipped",
        resume_damaged((2, "optimizer.safetensors", flip)),
        ("optimizer.safetensors: content differs from its recorded sha256 digest", "so step 1 is run again"),
        code=0,
        one_error=False,
    ),
    Case(
        "resume-latest-state-truncated",
        resume_damaged((2, "state.json", truncate)),
        ("state.json: truncated (", "so step 1 is run again"),
        code=0,
        one_error=False,
    ),
    Case(
        "resume-every-checkpoint-damaged",
        resume_damaged((2, "model/model.safetensors", truncate), (1, "rng.json", truncate)),
        (
            "error: no intact checkpoint to resume in run/checkpoints",
            "step_000002: model/model.safetensors: truncated (",
            "step_000001: rng.json: truncated (",
        ),
        absent=("SafetensorError", "JSONDecodeError"),
    ),
    Case("resume-a-missing-folder", resume_missing, ("nowhere",)),
    Case("resume-a-run-without-checkpoints", resume_without_checkpoint, ("run",)),
    # 7. one writer per run folder
    Case(
        "train-on-a-folder-in-use",
        in_use("train"),
        ("error: out is in use by another rlzoo process: pid ", "(holder-command)", "choose another output_dir"),
    ),
    Case(
        "resume-on-a-folder-in-use",
        in_use("train", copy=True),
        ("error: run is in use by another rlzoo process: pid ", "resume again"),
    ),
    Case(
        "check-a-folder-in-use",
        in_use("config", "check"),
        ("error: out is in use by another rlzoo process: pid ", "(holder-command)"),
    ),
    # 8. a resume that changes the run
    Case(
        "resume-with-changed-math",
        resume_with("--set", "trainer.lr=0.01", "--set", "rollout.group_size=4"),
        (
            "rollout.group_size: changed since the run started: 2 -> 4",
            "trainer.lr: changed since the run started: 0.0001 -> 0.01",
            "--allow-changes",
        ),
        one_error=False,
    ),
    Case(
        "resume-allowing-the-change",
        resume_with("--set", "trainer.lr=0.01", "--allow-changes", "trainer.lr"),
        ("resume     changes going ahead, recorded in run/config_changes.jsonl: trainer.lr 0.0001 -> 0.01",),
        code=0,
        one_error=False,
    ),
    # 9. numbers that are not finite, or out of range
    Case("lr-inf-set", sets("trainer.lr=inf"), ("trainer.lr: Input should be a finite number",)),
    Case(
        "nan-in-a-component-yaml",
        yaml_file(NONFINITE, "config", "check"),
        ("algorithm.clipper.eps_low: Input should be a finite number",),
        one_error=False,
    ),
    Case(
        "grad-clip-inf-yaml-train",
        sets("trainer.grad_clip=.inf", command=("train",)),
        ("trainer.grad_clip: Input should be a finite number",),
    ),
    Case(
        "lr-beyond-float32-train",
        sets("trainer.lr=1e39", command=("train",)),
        ("trainer.lr: 1e+39 does not fit in float32",),
    ),
    Case("beta-of-one", sets("trainer.betas=[0.9, 1.0]"), ("trainer.betas.1: Input should be less than 1",)),
]


def test_enough_cases():
    assert len(CASES) >= 25
    assert len({c.id for c in CASES}) == len(CASES)


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


Outcome = subprocess.CompletedProcess | CliResult


def _run(case: Case, folder: Path, ctx: Context, env: dict[str, str] | None = None) -> Outcome:
    argv = case.setup(folder, ctx)
    env = env if env is not None else _environment()
    if case.subprocess:
        return subprocess.run(
            [*_rlzoo_command(), *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=600
        )
    return run_cli(argv, folder, env)


def run_cases(jobs: list[tuple[Case, Path]], ctx: Context, env: dict[str, str] | None = None) -> list[Outcome]:
    """Every job's outcome, in order: the subprocess ones a few at a time (each spends seconds importing torch)
    while the rest run in this process, one after the other (a working folder and descriptors of their own)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        spawned = {
            i: pool.submit(_run, case, folder, ctx, env) for i, (case, folder) in enumerate(jobs) if case.subprocess
        }
        here = {i: _run(case, folder, ctx, env) for i, (case, folder) in enumerate(jobs) if not case.subprocess}
        return [spawned[i].result() if i in spawned else here[i] for i in range(len(jobs))]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[Path, Outcome]]:
    pytest.importorskip("datasets")
    ctx = Context(make_template(tmp_path_factory.mktemp("template")))
    jobs = [(case, tmp_path_factory.mktemp(case.id)) for case in CASES if CAN_LOCK or not case.locks]
    try:
        procs = run_cases(jobs, ctx)
    finally:
        for undo in ctx.undo:
            if undo is not None:
                undo()
    yield {case.id: (folder, proc) for (case, folder), proc in zip(jobs, procs)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_through_the_real_cli(results, case: Case):
    if case.locks and not CAN_LOCK:
        pytest.skip(NO_LOCK)
    folder, proc = results[case.id]
    shown = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    output = proc.stdout + proc.stderr
    assert proc.returncode == case.code, shown
    assert "Traceback" not in output, shown
    for text in case.expect:
        assert text in output, f"{text!r} missing; {shown}"
    for text in case.absent:
        assert text not in output, f"{text!r} present; {shown}"
    if case.once is not None:
        assert output.count(case.once) == 1, f"{case.once!r} not exactly once; {shown}"
    if case.one_error:
        assert [line for line in output.splitlines() if line.startswith("error:")] == [
            next(line for line in proc.stderr.splitlines() if line.startswith("error:"))
        ], shown
    if case.id.startswith("output-dir") and case.id.endswith("train"):
        assert not (folder / "out").exists()  # refused in the preflight, before any file was made


def test_the_torn_middle_line_does_not_hide_the_rest_of_the_run(results):
    folder, _ = results["compare-torn-middle-line"]
    table = (folder / "run" / "summary.md").read_text()
    assert "unfinished" not in table
    assert "| run | 1 | 0.5 | 0.5 | 0.25 | 0.25 | 0.75 | 1 |" in table  # initial 0.25 at step 0, gain 0.25


# -- the rules in-process ----------------------------------------------------------------------------------------


def test_read_metrics_skips_a_torn_line_in_the_middle_with_a_warning(tmp_path, caplog):
    from rlzoo.reporting.metrics_log import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 0}\n{"step": 1, "x\n\xff\xfe\n12\n{"step": 2}\n\n{"step": 3, "to')
    with caplog.at_level(logging.DEBUG, logger="rlzoo.reporting.metrics_log"):
        rows = read_metrics(path)
    assert [r["step"] for r in rows] == [0, 2]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(":")[0] for w in warnings] == [f"{path}, line {n}" for n in (2, 3, 4)]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == [f"{path}, line 7: cut short (a write interrupted by a crash); skipped"]


def test_read_metrics_is_quiet_about_a_torn_last_line(tmp_path, caplog):
    from rlzoo.reporting.metrics_log import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "reward/m')
    with caplog.at_level(logging.WARNING, logger="rlzoo.reporting.metrics_log"):
        assert [r["step"] for r in read_metrics(path)] == [0, 1]
    assert caplog.records == []


def test_resume_keeps_the_rows_after_a_torn_middle_line(tmp_path):
    from rlzoo.reporting.metrics_log import MetricsLogger, read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"ste\n{"step": 1}\n{"step": 2}\n{"step": 3, "x')
    MetricsLogger(tmp_path, keep_below_step=2)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0}\n{"step": 1}\n'
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]


def test_duplicate_yaml_keys_are_named_with_both_lines_in_line_order(tmp_path):
    from rlzoo.config.loading import read_yaml
    from rlzoo.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text("a: 1\nb:\n  c: [ {d: 1, d: 2} ]\n  e: 1\n  e: 2\na: 3\n")
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert [loc for loc, _ in info.value.problems] == ["b.c.0.d", "b.e", "a"]
    assert "duplicate key 'a' at line 6 (first at line 1)" in str(info.value)
    assert str(path) in str(info.value)


def test_merge_keys_and_aliases_are_not_duplicates(tmp_path):
    from rlzoo.config.loading import read_yaml

    path = tmp_path / "c.yaml"
    path.write_text("base: &b {lr: 1, wd: 0}\ntrainer:\n  <<: *b\n  lr: 2\nalso: [*b, *b]\n")
    assert read_yaml(path)["trainer"] == {"lr": 2, "wd": 0}


def test_folder_rules_with_permissions_stubbed(tmp_path, monkeypatch):
    """The permission rules, root or not: ``os.access`` answers as for a user who may not write to ``locked``."""
    from rlzoo.preflight import folders as preflight

    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    assert "is a folder this user cannot write to" in preflight.folder_problem(locked, "output_dir")
    problem = preflight.folder_problem(locked / "a" / "b", "output_dir")
    assert f"cannot be made: its parent folder {locked} is not writable" in problem
    assert preflight.folder_problem(tmp_path / "new" / "run", "output_dir") is None
    assert preflight.folder_problem(tmp_path, "output_dir") is None


def test_prompts_beyond_the_context_are_dropped_without_max_prompt_tokens(caplog):
    from rlzoo.config.schema import PromptConfig
    from rlzoo.episodes.prompts import fit_prompts, prompt_budget
    from rlzoo.errors import RlzooError
    from rlzoo.interfaces import Sample
    from rlzoo.models import build_char_tokenizer

    tok = build_char_tokenizer("0123456789+=")
    samples = [Sample("1+1=", "2"), Sample("1" * 40 + "+1=", "2"), Sample("2+2=", "4")]
    budget = prompt_budget(30, 4)
    assert budget == 26 and prompt_budget(None, 4) is None
    with caplog.at_level(logging.WARNING, logger="rlzoo.episodes.prompts"):
        kept = fit_prompts(samples, tok, PromptConfig(), "train", budget)
    assert [s.prompt for s in kept] == ["1+1=", "2+2="]
    assert "train split: 1 of 3 prompts are longer than the 26 tokens" in caplog.text
    assert fit_prompts(samples, tok, PromptConfig(), "train") == samples  # no budget known: as before
    assert len(fit_prompts(samples, tok, PromptConfig(), "train", 43)) == 3  # 43 tokens fit exactly
    with pytest.raises(RlzooError, match="every prompt of the eval split is longer than the 3 tokens"):
        fit_prompts(samples, tok, PromptConfig(), "eval", 3)
