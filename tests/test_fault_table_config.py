"""The fault table's config rows of issue 36, through the real CLI: inputs that passed silently or ended in a traceback.

Each case runs ``rlzoo ...`` through the CLI's entry function in this process (tests/cli_testlib.py; as a real
subprocess only where it must run as another user) and is checked as tests/test_fault_table.py checks its own (its
:class:`Case` and its check, imported): exit 1, no traceback, one ``error:`` line naming the field (and the file).
The rows: a tool listed twice in ``episode.tools``; the tools environment on a policy whose tokenizer cannot write the
tool-call markup; a critic on another tokenizer than a tiny policy's; a memory size beyond a float; a data file this
user may not read (as root, run as ``nobody`` through ``setpriv``, since root reads a mode-000 file); and two
``rlzoo ablate`` on one ``--out`` at once, the second refused at once while the first goes on unaffected. The rules
behind them are tested in-process beside their modules (tests/test_episode_tool_rules.py,
tests/test_critic_tokenizer.py, tests/test_units.py, tests/test_sweep_lock.py,
plugins/tasks/tests/test_tasks_unreadable.py).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cli_testlib import CliResult, run_cli
from folder_testlib import write_weights
from test_cli import _rlzoo_command
from test_fault_table import BASE, Case, Context, config, data_file, merge, rows_jsonl
from test_fault_table import _environment as environment
from test_fault_table import test_bad_input_through_the_real_cli as check_case  # an alias: not collected here

from rlzoo.models.tokenizer import char_vocab
from rlzoo.runtime import runlock

TOOLS = {"environment": {"name": "tools"}, "tools": [{"name": "calculator"}], "max_turns": 2}
HERMES = '<tool_call>{"name":"","arguments":{}}</tool_call>'
NOBODY = 65534


@dataclass
class UserCase(Case):
    """A case run as another user than root (``nobody``) when the tests run as root: root reads any file."""

    other_user: bool = False


def _drop_privileges() -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


@functools.cache
def _cannot_run_as_another_user() -> str | None:
    """Why the cases of a file this user may not read cannot run here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return None  # chmod 000 stops this user
    if shutil.which("setpriv") is None:
        return "running as root, which reads a mode-000 file, and setpriv (util-linux) is not installed"
    probe = subprocess.run(
        [*_drop_privileges(), *_rlzoo_command(), "--help"],
        capture_output=True,
        text=True,
        env={**environment(), "HOME": tempfile.gettempdir()},
        timeout=300,
        cwd=tempfile.gettempdir(),
    )
    if probe.returncode != 0:
        return (
            "running as root, which reads a mode-000 file, and user 'nobody' cannot run rlzoo here (its code or "
            f"interpreter are in a folder only root may enter): {probe.stderr.strip()[-300:]}"
        )
    return None


# -- the cases ---------------------------------------------------------------------------------------------------


def check(extra: dict, command: str = "check", *flags: str) -> Callable[[Path, Context], list[str]]:
    def setup(folder: Path, ctx: Context) -> list[str]:
        return [*(["config", "check"] if command == "check" else [command]), config(folder, extra), *flags]

    return setup


def model_folder(folder: Path, alphabet: str) -> str:
    """A model folder on the character tokenizer of ``alphabet`` (config.json, tokenizer.json, a weights file): the
    preflight reads these files' metadata, never the weights."""
    vocab = char_vocab(alphabet)
    hf = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 256,
        "vocab_size": len(vocab),
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
    }
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf))
    (folder / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "WordLevel", "vocab": vocab}, "added_tokens": []})
    )
    write_weights(folder)  # the tensors config.json describes, zeros
    return folder.name


def with_model(role: str, alphabet: str, command: str) -> Callable[[Path, Context], list[str]]:
    """``role`` ``policy``: model.path a folder on ``alphabet``'s tokenizer, with tools; ``critic``: a tiny policy
    (the arithmetic task's tokenizer) and a PPO critic on ``alphabet``'s."""

    def setup(folder: Path, ctx: Context) -> list[str]:
        path = model_folder(folder / role, alphabet)
        extra = (
            {"model": {"path": path}, "cold_start": {"enabled": False}, "episode": TOOLS}
            if role == "policy"
            else {"algorithm": {"preset": "ppo", "critic": {"model": path}}}
        )
        return check(extra, command)(folder, ctx)

    return setup


def jsonl_task(command: str, extra: dict | None = None) -> Callable[[Path, Context], list[str]]:
    def setup(folder: Path, ctx: Context) -> list[str]:
        data_file(folder, "data.jsonl", rows_jsonl())
        return check(merge({"task": {"name": "jsonl", "path": "data.jsonl"}}, extra or {}), command)(folder, ctx)

    return setup


def unreadable(task: str, command: str, field: str = "path") -> Callable[[Path, Context], list[str]]:
    """``task`` on a data file of mode 000 (``field``: the train file, or the eval file beside a readable one)."""

    def setup(folder: Path, ctx: Context) -> list[str]:
        data_file(folder, "data.jsonl", rows_jsonl())
        data_file(folder, "eval.jsonl", [json.dumps({"prompt": f"{i}*2=", "answer": str(2 * i)}) for i in range(4)])
        (folder / ("data.jsonl" if field == "path" else "eval.jsonl")).chmod(0)
        params = {"name": task, "path": "data.jsonl", **({"eval_path": "eval.jsonl"} if field == "eval_path" else {})}
        return check({"task": params}, command)(folder, ctx)

    return setup


TWICE = {"tools": [{"name": "calculator"}, {"name": "python"}, {"name": "calculator", "timeout_s": 2}]}
MARKUP = "episode.tool_parser: 'hermes' writes a call as " + HERMES
DENIED = (
    "Permission denied: this user (uid 65534) may not read it (mode 000"
    if os.geteuid() == 0
    else f"Permission denied: this user (uid {os.geteuid()}) may not read it (mode 000"
)

CASES = [
    # 1. a tool listed twice: the second entry silently replaced the first
    UserCase(
        "tool-listed-twice-check",
        check({"episode": {**TOOLS, **TWICE}}),
        ("episode.tools.2: tool 'calculator' is listed twice (first at episode.tools.0)",),
    ),
    # 2. the tools environment where the policy's tokenizer cannot write a call: the run made none, silently
    UserCase(
        "tool-markup-tiny-arithmetic-check",
        check({"episode": TOOLS}),
        (
            MARKUP,
            "(calculator)",
            "built from the alphabet of task 'arithmetic'",
            "cannot write '\"', ',',",
            "calculator-arithmetic",
        ),
    ),
    UserCase(
        "tool-markup-jsonl-train",
        jsonl_task("train", {"episode": TOOLS}),
        (MARKUP, "built from the alphabet of task 'jsonl'", "cannot write '\"', ',',"),
    ),
    UserCase(
        "tool-markup-model-folder-check",
        with_model("policy", "0123456789+-*=", "check"),
        (MARKUP, "the tokenizer.json of policy", "cannot write '\"', ',',"),
    ),
    # 3. a critic on another tokenizer than a tiny policy's (checked only for a model.path policy before)
    UserCase(
        "critic-tokenizer-tiny-policy-check",
        with_model("critic", "abcdefghijklmn", "check"),
        (
            "algorithm.critic.model: the tokenizer of critic differs from the policy's (the tiny model's character "
            "tokenizer, built from the alphabet of task 'arithmetic'): 28 tokens differ",
        ),
    ),
    UserCase(
        "critic-vocab-tiny-policy-train",
        with_model("critic", "0123456789+=", "train"),
        ("algorithm.critic.model: critic has vocab_size 15 but the policy 17",),
    ),
    # 4. a memory size beyond a float: an OverflowError before
    UserCase(
        "device-memory-overflow-yaml-check",
        check({"trainer": {"device_memory": "1e400GB"}}),
        ("trainer.device_memory: '1e400GB' is too large a memory size (beyond 1.8e+308 bytes)", "80GiB"),
    ),
    UserCase(
        "device-memory-overflow-flag",
        check({}, "check", "--device-memory", "1e400GB"),
        ("--device-memory: '1e400GB' is too large a memory size",),
    ),
    # 5. a data file this user may not read: a PermissionError traceback before
    UserCase(
        "unreadable-jsonl-check", unreadable("jsonl", "check"), ("task.path: data.jsonl: " + DENIED,), other_user=True
    ),
    UserCase(
        "unreadable-jsonl-eval-check",
        unreadable("jsonl", "check", "eval_path"),
        ("task.eval_path: eval.jsonl: " + DENIED,),
        other_user=True,
    ),
    UserCase(
        "unreadable-dataset-check",
        unreadable("dataset", "check"),
        ("task.path: data.jsonl: " + DENIED,),
        other_user=True,
    ),
]


def test_the_cases_are_distinct():
    assert len({c.id for c in CASES}) == len(CASES) >= 11


def _run(case: UserCase, folder: Path, ctx: Context) -> subprocess.CompletedProcess | CliResult:
    argv = case.setup(folder, ctx)
    env = {**environment(), "HOME": str(folder)}
    if not (case.other_user and os.geteuid() == 0):
        return run_cli(argv, folder, env)
    return subprocess.run(
        [*_drop_privileges(), *_rlzoo_command(), *argv],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def results() -> dict[str, tuple[Path, subprocess.CompletedProcess | CliResult]]:
    cases = [c for c in CASES if not (c.other_user and _cannot_run_as_another_user())]
    # not pytest's tmp_path: its folders are private to this user, and a case may run as another one
    root = Path(tempfile.mkdtemp(prefix="rlzoo-fault-table-config-"))
    try:
        jobs = []
        for case in cases:
            (root / case.id).mkdir(mode=0o777)
            (root / case.id).chmod(0o777)  # whatever the umask: nobody writes its run folder here
            jobs.append((case, root / case.id))
        root.chmod(0o755)
        ctx = Context(template=root)  # no case of this table resumes a run
        spawned = [job for job in jobs if job[0].other_user and os.geteuid() == 0]
        with ThreadPoolExecutor(max_workers=3) as pool:  # each spends seconds importing torch
            running = {job[0].id: pool.submit(_run, *job, ctx) for job in spawned}
            here = {case.id: _run(case, folder, ctx) for case, folder in jobs if case.id not in running}
            procs = [running[case.id].result() if case.id in running else here[case.id] for case, _ in jobs]
        yield {case.id: (folder, proc) for (case, folder), proc in zip(jobs, procs)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_config_faults_through_the_real_cli(results, case: UserCase):
    if case.other_user and _cannot_run_as_another_user():
        pytest.skip(_cannot_run_as_another_user())
    check_case(results, case)
    if case.id.endswith("-train"):
        assert not (results[case.id][0] / "out").exists()  # refused in the preflight, before anything was written


# -- two sweeps on one --out ---------------------------------------------------------------------------------------

SWEEP_SECONDS = 600  # the tiny sweep: a cold start of 2 steps and a run of 1 step, each a process importing torch


def _ablate(folder: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*_rlzoo_command(), "ablate", "run.yaml", "--vary", "trainer.lr=0.0001", "--seeds", "1", "--out", "sweep"],
        cwd=folder,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # two sweeps at once; a second train on a folder in use is refused by default (test_runlock.py)
def test_a_second_sweep_on_the_same_out_is_refused_at_once_and_the_first_is_unaffected(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(BASE))
    first = _ablate(tmp_path)
    try:
        deadline = time.monotonic() + SWEEP_SECONDS
        while runlock.holder_of(tmp_path / "sweep" / runlock.LOCK_NAME) is None:  # the first sweep claimed --out
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first sweep never took its folder's lock"
            time.sleep(0.2)
        started = time.monotonic()
        second = subprocess.run(
            [*_rlzoo_command(), "ablate", "run.yaml", "--vary", "trainer.lr=0.0001", "--seeds", "1", "--out", "sweep"],
            cwd=tmp_path,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        refused_in = time.monotonic() - started
        out, err = first.communicate(timeout=SWEEP_SECONDS)
    finally:
        if first.poll() is None:
            first.kill()
    shown = f"second: exit {second.returncode}\n{second.stderr}\nfirst: exit {first.returncode}\n{err[-3000:]}"
    assert second.returncode == 1 and "Traceback" not in second.stdout + second.stderr, shown
    (line,) = [text for text in second.stderr.splitlines() if text.startswith("error:")]
    in_use = f"error: sweep folder sweep is in use by another rlzoo process: pid {first.pid} on host "
    assert line.startswith(in_use), shown
    assert "(rlzoo ablate run.yaml --vary trainer.lr=0.0001 --seeds 1 --out sweep)" in line
    assert "choose another --out" in line and "failed:" not in second.stderr, shown
    # at once: before it built its grid or preflighted a run (seconds of importing; the sweep takes minutes)
    assert "cells x" not in second.stderr and refused_in < 120, shown
    # the first sweep: every job succeeded, its summary written, nothing of the second in its folder
    assert first.returncode == 0, shown
    assert "failed:" not in err and "job(s) failed" not in err and "was not built" not in err, shown
    assert (tmp_path / "sweep" / "summary.md").is_file() and "| lr-0.0001 | 1 |" in (
        tmp_path / "sweep" / "summary.md"
    ).read_text()
