"""rlzoo.reporting.console: what reaches the terminal and what goes to the run's log file, in a real process (fds included)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlzoo.config.resolution import build_config
from rlzoo.reporting.console import Actionable, Console, final_summary, log_path, start_summary

# Every kind of output an engine makes at start-up, each tagged, emitted inside run_console.
NOISY = r"""
import ctypes, logging, os, sys, warnings
from pathlib import Path

from tqdm import tqdm

from rlzoo.reporting.console import run_console

log_file, verbose = Path(sys.argv[1]), sys.argv[2] == "1"
with run_console(log_file, verbose) as console:
    console.print("SUMMARY-LINE")
    for _ in tqdm(range(3), desc="OUR-BAR"):
        pass
    logging.getLogger("vllm.engine").warning("LIB-WARNING")
    logging.getLogger("deepspeed").info("LIB-INFO")
    logging.getLogger("transformers.modeling_utils").warning("HF-WARNING")
    logging.getLogger("torch.distributed").error("LIB-ERROR")
    logging.getLogger("rlzoo.runtime.run").warning("OUR-WARNING")
    logging.getLogger("rlzoo_estimators.x").warning("PLUGIN-WARNING")
    logging.getLogger("rlzoo.runtime.run").info("OUR-INFO")
    warnings.warn("PY-WARNING", FutureWarning)  # raised from this script: not rlzoo code
    print("PRINTED-TO-STDOUT")
    print("PRINTED-TO-STDERR", file=sys.stderr)
    sys.stdout.flush()
    os.write(1, b"C-LEVEL-FD1\n")
    os.write(2, b"C-LEVEL-FD2\n")
    ctypes.CDLL(None).puts(b"LIBC-PUTS")  # C stdio, as a C++ library writes
    ctypes.CDLL(None).fflush(None)
print("AFTER-THE-RUN")
raise SystemExit(0)
"""

CONSOLE_ONLY = {"SUMMARY-LINE", "OUR-BAR", "PRINTED-TO-STDERR"}
LOG_ONLY = {
    "LIB-WARNING",
    "LIB-INFO",
    "HF-WARNING",
    "PY-WARNING",
    "PRINTED-TO-STDOUT",
    "C-LEVEL-FD1",
    "C-LEVEL-FD2",
    "LIBC-PUTS",
}
BOTH = {"LIB-ERROR", "OUR-WARNING", "PLUGIN-WARNING"}  # actionable: shown, and kept in the log


def run_noisy(tmp_path: Path, verbose: bool) -> tuple[str, str]:
    log_file = tmp_path / "run" / "log.txt"
    proc = subprocess.run(
        [sys.executable, "-c", NOISY, str(log_file), "1" if verbose else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr, log_file.read_text()


def test_quiet_console_shows_only_what_a_user_can_act_on(tmp_path):
    console, log = run_noisy(tmp_path, verbose=False)
    for tag in CONSOLE_ONLY | BOTH | {"AFTER-THE-RUN"}:
        assert tag in console, (tag, console)
    for tag in LOG_ONLY | {"OUR-INFO"}:
        assert tag not in console, (tag, console)
    for tag in LOG_ONLY | BOTH | {"OUR-INFO"}:
        assert tag in log, (tag, log)
    assert "SUMMARY-LINE" not in log and "AFTER-THE-RUN" not in log


def test_verbose_console_shows_everything_and_still_logs_the_records(tmp_path):
    console, log = run_noisy(tmp_path, verbose=True)
    for tag in CONSOLE_ONLY | LOG_ONLY | BOTH | {"OUR-INFO"}:
        assert tag in console, (tag, console)
    for tag in {"LIB-WARNING", "LIB-INFO", "HF-WARNING", "OUR-INFO"} | BOTH:
        assert tag in log, (tag, log)


def test_actionable_filter():
    import logging

    def passes(name: str, level: int) -> bool:
        return Actionable().filter(logging.LogRecord(name, level, __file__, 1, "m", None, None))

    assert passes("rlzoo.runtime.run", logging.WARNING) and passes("rlzoo_routing.r3", logging.WARNING)
    assert passes("vllm.engine", logging.ERROR)
    assert not passes("vllm.engine", logging.WARNING)
    assert not passes("rlzoo.runtime.run", logging.INFO)
    assert not passes("rlzoo2", logging.INFO)


def test_log_path_per_rank(tmp_path):
    assert log_path(tmp_path) == tmp_path / "log.txt"
    assert log_path(tmp_path, 3) == tmp_path / "log.rank3.txt"


def test_summaries(tmp_path):
    config = build_config({"algorithm": {"preset": "gspo", "kl_coef": 0.01}, "train": {"steps": 4}}, [])
    console = Console(out=sys.stdout, err=sys.stderr, log_file=tmp_path / "log.txt", verbose=False)
    start = start_summary("train", "run.yaml", config, tmp_path, console)
    assert start[0] == "rlzoo train run.yaml"
    text = "\n".join(start)
    assert "gspo preset: ratio sequence" in text and "kl k3 x 0.01" in text
    assert f"output     {tmp_path}" in text and str(tmp_path / "log.txt") in text
    assert "schedule   4 RL steps" in text

    rows = [{"step": 0, "eval/accuracy": 0.25}, {"step": 0, "reward/mean": 0.1}, {"step": 4, "eval/accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "checkpoints" / "step_000004").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").write_text("step_000004")
    final = final_summary(tmp_path, "run.yaml", console)
    assert final[0] == "held-out accuracy: 0.250 (step 0) -> 0.500 (step 4)"
    text = "\n".join(final)
    for expected in ("metrics.jsonl", "step_000004", f"--resume {tmp_path}", "log.txt", f"rlzoo plot {tmp_path}"):
        assert expected in text, expected
    assert "held-out reward" not in text  # no reward logged: nothing to add


@pytest.mark.parametrize(
    ("rewards", "line"),
    [
        ((0.25, 0.5), None),  # a right/wrong verifier: the reward is the accuracy, said once
        ((0.729, 0.927), "held-out reward:   0.729 (step 0) -> 0.927 (step 40)"),  # a judge's score
    ],
)
def test_the_summary_says_the_held_out_reward_when_it_is_not_the_accuracy(tmp_path, rewards, line):
    console = Console(out=sys.stdout, err=sys.stderr, log_file=None, verbose=False)
    rows = [
        {"step": 0, "eval/accuracy": 0.25, "eval/reward_mean": rewards[0]},
        {"step": 40, "eval/accuracy": 0.5, "eval/reward_mean": rewards[1]},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = final_summary(tmp_path, "run.yaml", console)
    assert final[0] == "held-out accuracy: 0.250 (step 0) -> 0.500 (step 40)"
    assert final[1] == line if line else not final[1].startswith("held-out reward")


def test_sft_summary_has_no_rl_lines(tmp_path):
    config = build_config({}, [])
    console = Console(out=sys.stdout, err=sys.stderr, log_file=None, verbose=False)
    text = "\n".join(start_summary("sft", "run.yaml", config, tmp_path, console))
    assert "schedule" not in text and "algorithm" not in text and "log " not in text


def test_our_files_are_the_rlzoo_packages_folders_not_any_folder_named_rlzoo(tmp_path):
    """A checkout cloned as ``rlzoo/`` keeps its venv inside: a library's warning from there is not rlzoo's."""
    import rlzoo
    import rlzoo.reporting.console as console_module

    assert console_module.is_our_file(console_module.__file__)
    assert console_module.is_our_file(str(Path(rlzoo.__file__).parent / "engines" / "any.py"))
    venv_library = tmp_path / "rlzoo" / ".venv" / "lib" / "python3.11" / "site-packages" / "vllm" / "dispatcher.py"
    assert not console_module.is_our_file(str(venv_library))
    assert not console_module.is_our_file(str(Path(rlzoo.__file__).parent) + "_extra/x.py")  # a sibling, not inside
