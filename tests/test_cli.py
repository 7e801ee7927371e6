"""The ``rlzoo`` command line: plugin listing, config checking, errors as messages (never tracebacks)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from rlzoo.cli import main

REPO = Path(__file__).resolve().parents[1]
ALGORITHM_KINDS = ("ratio", "advantage", "clipper", "aggregation", "kl")

BAD_RATIO = "algorithm:\n  ratio: {name: sequense}\n"


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_plugins_list_json(capsys):
    assert main(["plugins", "list", "--json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert isinstance(rows, list) and rows
    for row in rows:
        assert {"kind", "name", "distribution", "summary"} <= set(row)
        assert all(isinstance(row[k], str) and row[k] for k in ("kind", "name", "distribution", "summary")), row
    per_kind = Counter(row["kind"] for row in rows)
    for kind in ALGORITHM_KINDS:
        assert per_kind[kind] >= 3, (kind, per_kind)
        # the core ships no algorithm component itself: every one comes from a plugin distribution
        assert all(row["distribution"] != "rlzoo" for row in rows if row["kind"] == kind), kind
    names = {(row["kind"], row["name"]): row["distribution"] for row in rows}
    assert names[("ratio", "sequence")] == "rlzoo-estimators"
    assert names[("clipper", "ppo")] == "rlzoo-estimators"
    assert len(names) == len(rows)  # no (kind, name) twice
    assert "warning" not in err


def test_plugins_list_table(capsys):
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    header, *lines = out.splitlines()
    assert header.split()[:3] == ["kind", "name", "distribution"]
    assert any(line.split()[:3] == ["clipper", "ppo", "rlzoo-estimators"] for line in lines)


def test_config_check_unknown_component(tmp_path, capsys):
    path = write(tmp_path, BAD_RATIO)
    assert main(["config", "check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "algorithm.ratio.name" in err
    assert "did you mean 'sequence'?" in err
    for name in ("token", "sequence", "sequence-token"):
        assert name in err
    assert "Traceback" not in err


def test_config_check_valid_prints_resolved_yaml(tmp_path, capsys):
    path = write(tmp_path, "algorithm:\n  preset: dapo\n  clipper: {eps_high: 0.3}\ntrain: {steps: 2}\n")
    assert main(["config", "check", str(path), "--set", "seed=5", "--set", "algorithm.kl_coef=0.01"]) == 0
    out, err = capsys.readouterr()
    resolved = yaml.safe_load(out)
    assert resolved["seed"] == 5
    assert resolved["train"]["steps"] == 2
    assert resolved["algorithm"]["clipper"] == {"name": "ppo", "eps_low": 0.2, "eps_high": 0.3}
    assert resolved["algorithm"]["aggregation"]["name"] == "token-mean"
    assert resolved["algorithm"]["kl_coef"] == 0.01
    assert "std_normalize" in resolved["algorithm"]["advantage"]  # component defaults filled in
    # what it prints is itself a config that checks
    again = write(tmp_path, out, "resolved.yaml")
    capsys.readouterr()
    assert main(["config", "check", str(again)]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == resolved


def test_config_check_example(capsys):
    import importlib.util

    # the example's engines need vLLM and DeepSpeed; the check refuses an engine whose package is missing
    swaps = {"vllm": "rollout.engine={name: hf}", "deepspeed": "trainer.engine={name: torch}"}
    overrides = [
        arg for package, swap in swaps.items() if importlib.util.find_spec(package) is None for arg in ("--set", swap)
    ]
    assert main(["config", "check", str(REPO / "examples" / "gspo_tiny_moe.yaml"), *overrides]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["algorithm"]["ratio"]["name"] == "sequence"


@pytest.mark.parametrize(
    "content, args, expected",
    [
        (None, [], "not found"),
        ("a: [b\n", [], "not valid YAML"),
        ("seed: 1\n", ["--set", "seed"], "not of the form"),
        ("seed: 1\n", ["--set", "seed.x=1"], "not a section"),
        ("algorithm: {clipper: {name: ppo, eps_hgh: 0.3}}\n", [], "algorithm.clipper.eps_hgh"),
        ("algorithm: {preset: gspoo}\n", [], "did you mean 'gspo'?"),
    ],
)
def test_config_check_errors_are_messages(tmp_path, capsys, content, args, expected):
    path = tmp_path / "run.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["config", "check", str(path), *args]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ")
    assert expected in err
    assert "Traceback" not in err


def test_verbose_reraises_for_debugging(tmp_path):
    from rlzoo.errors import ConfigError

    with pytest.raises(ConfigError):
        main(["-v", "config", "check", str(write(tmp_path, BAD_RATIO))])


def _rlzoo_command() -> list[str]:
    script = Path(sys.executable).with_name("rlzoo")
    if script.exists():
        return [str(script)]
    found = shutil.which("rlzoo")
    return [found] if found else [sys.executable, "-m", "rlzoo.cli"]


def test_subprocess_config_check_error_has_no_traceback(tmp_path):
    bad = write(tmp_path, BAD_RATIO)
    proc = subprocess.run(
        [*_rlzoo_command(), "config", "check", str(bad)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert "did you mean 'sequence'?" in proc.stderr
    assert "sequence-token" in proc.stderr and "token" in proc.stderr
    assert proc.stderr.startswith("error: invalid config")


def test_config_check_processes_must_be_positive(tmp_path, capsys):
    path = write(tmp_path, "seed: 1\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["config", "check", str(path), "--processes", "0"])
    assert exit_info.value.code == 2
    assert "--processes: '0' is not a positive whole number" in capsys.readouterr().err


def test_config_check_for_several_processes(tmp_path, capsys):
    path = write(
        tmp_path,
        f"output_dir: {tmp_path / 'out'}\nrollout: {{prompts_per_step: 1, group_size: 2}}\n"
        "algorithm: {minibatches_per_rollout: 2}\n",
    )
    assert main(["config", "check", str(path)]) == 0
    capsys.readouterr()
    assert main(["config", "check", str(path), "--processes", "2"]) == 1
    assert "2 processes need at least 2 rows in every minibatch" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- a run's console
# the main job's engines (vLLM when installed, else transformers generate; DeepSpeed with DeepSpeed-MoE) on the
# smallest possible run: the engines start up, sync and shut down as in the main job
TINY_RUN = [
    "cold_start.steps=2",
    "cold_start.batch_size=8",
    "cold_start.examples=32",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=4",
    "train.steps=1",
    "train.eval_every=1",
    "train.eval_prompts=4",
    "train.eval_samples_per_prompt=1",
    "train.checkpoint_every=1",
]
SUMMARY_START = ("rlzoo train ", "  algorithm  ", "  model      ", "  task       ", "  engines    ", "  schedule   ")
SUMMARY_END = ("held-out accuracy: ", "results in ", "  metrics      ", "  checkpoint   ", "  log          ", "  plot ")
BARS = ("cold start (SFT):", "rl:")


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def console_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """The same tiny run twice, quiet and ``--verbose`` (the second reuses the first's cold start). The quiet run
    samples with vLLM where it is installed (its start-up messages must stay off the console); the verbose one with
    hf, since DeepSpeed's messages already show whether the engines' output reaches the console, and a second vLLM
    start would add ~20 s."""
    root = tmp_path_factory.mktemp("console")
    config = REPO / "examples" / "gspo_tiny_moe.yaml"
    overrides = [*TINY_RUN, f"cold_start.output_dir={root / 'cold'}"]
    runs = {}
    for mode, extra in (("quiet", []), ("verbose", ["--verbose"])):
        run_dir = root / mode
        rollout = "vllm" if mode == "quiet" and _has_vllm() else "hf"
        sets = [
            a
            for o in [*overrides, f"rollout.engine={{name: {rollout}}}", f"output_dir={run_dir}"]
            for a in ("--set", o)
        ]
        command = [*_rlzoo_command(), "train", str(config), *sets, *extra]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=root)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[mode] = (proc, run_dir)
    return runs


def _terminal_lines(text: str) -> list[str]:
    """What stays on a terminal: a progress bar redraws its line with \\r, so only the last draw counts."""
    return [line.split("\r")[-1] for line in text.splitlines()]


def test_run_console_is_the_summary_and_the_bars(console_runs):
    proc, run_dir = console_runs["quiet"]
    out = _terminal_lines(proc.stdout)
    # stdout: the start summary, then the final one, and nothing else (engines print to stdout: none of it shows)
    assert [line.startswith(SUMMARY_START + ("  output     ", "  log        ")) for line in out[:8]] == [True] * 8, out
    assert all(line.startswith(SUMMARY_START + SUMMARY_END + ("  output     ", "  log        ")) for line in out), out
    assert out[-1] == f"  plot         rlzoo plot {run_dir}", out
    assert any(line.startswith("held-out accuracy: ") for line in out), out
    # stderr: the progress bars only, one after the other
    for fragment in proc.stderr.replace("\r", "\n").splitlines():
        assert fragment == "" or fragment.startswith(BARS), (fragment, proc.stderr[-3000:])
    assert len(out) + len(_terminal_lines(proc.stderr)) < 50
    # the engines' start-up messages are in the run's log instead
    log = (run_dir / "log.txt").read_text()
    assert "Setting accelerator to CPU" in log  # DeepSpeed's logger, bound to stdout
    assert "No existing process group found" in log  # DeepSpeed-MoE's print()
    if _has_vllm():
        assert "vllm." in log and "Failed to load weights" not in log


def test_verbose_run_console_shows_the_engines(console_runs):
    quiet, _ = console_runs["quiet"]
    verbose, run_dir = console_runs["verbose"]
    console = verbose.stdout + verbose.stderr
    assert "Setting accelerator to CPU" in console and "No existing process group found" in console
    assert "held-out accuracy: " in verbose.stdout
    assert len(console.splitlines()) > len((quiet.stdout + quiet.stderr).splitlines())  # the engines' lines added
    assert (run_dir / "log.txt").is_file()
