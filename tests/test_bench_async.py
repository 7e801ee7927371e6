"""benchmarks/async_simulation.py's model and benchmarks/async_throughput.py's summary: the calibration reproduces
the measured synchronous phase times, a producer held at k = 0 on the same devices takes the synchronous time, the
pipeline never beats its slower phase, and the ratios are computed against the runs of the same invocation."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import async_simulation as sim  # noqa: E402
import async_throughput as bench  # noqa: E402


def _batches(seed: int = 0, steps: int = 6, batch: int = 256) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.minimum(np.ceil(rng.lognormal(np.log(300), 0.9, batch)), 4096) for _ in range(steps)]


def test_calibration_reproduces_the_synchronous_phase_times():
    batches = _batches()
    phases = {"generate": 10.0, "old_logprobs": 2.0, "train": 5.0, "devices": 8}
    costs = sim.calibrate(phases, batches, b_sat=64.0, serial=0.3)
    total = sim.sync_time(batches, 8, costs)
    assert total == pytest.approx(len(batches) * 17.0, rel=1e-9)


@pytest.mark.parametrize("old_pass", [True, False])
def test_k0_on_the_same_devices_is_the_synchronous_schedule(old_pass):
    batches = _batches(1)
    costs = sim.calibrate({"generate": 4.0, "old_logprobs": 1.0, "train": 3.0, "devices": 4}, batches, 32.0, 0.0)
    expected = sum(g + t for g, t in (sim.phase_times(b, 4, costs, False, old_pass) for b in batches))
    assert sim.async_time(batches, 4, 4, costs, 0, False, old_pass) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_pipeline_is_bounded_by_its_slower_phase_and_gains_with_staleness(k):
    batches = _batches(2)
    costs = sim.calibrate({"generate": 4.0, "old_logprobs": 1.0, "train": 3.0, "devices": 4}, batches, 32.0, 0.0)
    gen = sum(sim.phase_times(b, 2, costs, False, True)[0] for b in batches)
    train = sum(sim.phase_times(b, 2, costs, False, True)[1] for b in batches)
    t = sim.async_time(batches, 2, 2, costs, k, False, True)
    assert max(gen, train) <= t + 1e-9
    assert t < sim.async_time(batches, 2, 2, costs, 0, False, True)  # running ahead overlaps the phases
    assert t <= gen + train


def test_streaming_removes_the_long_tail():
    lengths = np.array([10.0] * 63 + [1000.0])
    assert (
        sim.decode_iterations(lengths, 1, 1e9, stream=True) < sim.decode_iterations(lengths, 1, 1e9, stream=False) / 10
    )


def test_throughput_ratios_are_against_runs_of_the_same_invocation():
    def run(seconds, tokens, staleness):
        return {"status": "ok", "step_seconds": seconds, "tokens": tokens, "staleness": staleness, "phases": {}}

    result = {
        "runs": {
            "sync": run([2.0, 2.0], [100, 100], [0, 0]),
            "0": run([2.5, 2.5], [100, 100], [0, 0]),
            "2": run([1.0, 1.0], [100, 100], [1, 2]),
            "4": {"status": "failed", "log": "x"},
        }
    }
    bench.summarise(result)
    runs = result["runs"]
    assert runs["2"]["steps_ratio_vs_0"] == pytest.approx(2.5)
    assert runs["2"]["tokens_ratio_vs_sync"] == pytest.approx(2.0)
    assert runs["2"]["mean_staleness"] == 1.5
    assert "steps_ratio_vs_0" not in runs["4"]
    assert "| 4 | failed" in bench.report(
        {
            **result,
            "scale": "long",
            "steps": 3,
            "warmup": 1,
            "machine": {"platform": "p", "cpus": 2, "load_before": [0.1], "date": "d"},
        }
    )


def test_a_setting_that_is_no_schedule_is_refused():
    with pytest.raises(SystemExit, match="not sync, overlap, a staleness bound"):
        bench.overrides_for("fast")
    with pytest.raises(SystemExit, match="partial-rollout mode of continue, restart"):
        bench.overrides_for("2:stream")


def test_a_partial_rollout_setting_is_its_bound_and_its_mode():
    assert bench.overrides_for("2:continue") == ["rollout.max_staleness=2", "rollout.partial=continue"]
    assert bench.overrides_for("1") == ["rollout.max_staleness=1"]
    assert [bench.staleness_of(s) for s in ("sync", "overlap", "0", "4:restart")] == [None, None, 0, 4]
    partial = {
        "status": "ok",
        "step_seconds": [1.0, 1.0],
        "tokens": [10, 10],
        "staleness": [1, 1],
        "phases": {},
        "token_staleness": [0.5, 0.25],
        "interrupted": [1.0, 0.5],
    }
    result = {"runs": {"1:continue": partial}}
    bench.summarise(result)
    assert partial["mean_token_staleness"] == 0.375 and partial["mean_interrupted"] == 0.75
    table = bench.report(
        {
            **result,
            "scale": "long",
            "steps": 3,
            "warmup": 1,
            "set": ["algorithm.minibatches=1"],
            "machine": {"platform": "p", "cpus": 2, "load_before": [0.1], "date": "d"},
        }
    )
    assert "| 1:continue | 1.00 |" in table and "1.00, 0.38 | 75% |" in table
    assert "Config changes: `algorithm.minibatches=1`" in table


def test_the_openmp_benchmark_prints_each_variant_against_alone():
    """benchmarks/openmp_threads.py as a user runs it (one short repeat): a row per variant, "alone" at 1.00x."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "openmp_threads.py"
    run = subprocess.run(
        [sys.executable, str(script), "--repeats", "1", "--iterations", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith(("alone", "idle second thread"))]
    assert len(rows) == 4 and rows[0].split()[2] == "1.00x"
    bad = subprocess.run([sys.executable, str(script), "--repeats", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--repeats and --iterations must be at least 1" in bad.stderr


def test_disaggregated_splits_against_sync_on_the_same_devices():
    """``--split``: the half split is the N/2 + N/2 schedule, every split of N is compared with sync on N, a push
    per step only slows it, and the best split is named per schedule."""
    batches = _batches(3)
    costs = sim.calibrate({"generate": 6.0, "old_logprobs": 1.0, "train": 3.0, "devices": 8}, batches, 32.0, 0.5)
    assert sim.parse_split("8") == [(g, 8 - g) for g in range(1, 8)] and sim.parse_split("6:2") == [(6, 2)]
    assert [g for g, _ in sim.parse_split("128")] == list(range(16, 128, 16))
    for bad in ("0:8", "x", "1"):
        with pytest.raises(SystemExit, match="--split"):
            sim.parse_split(bad)
    rows = sim.split_rows(batches, sim.parse_split("8"), costs, k=1, push=0.0)
    half = next(r for r in rows if (r["gen"], r["schedule"], r["old_pass"]) == (4, "async k=1", True))
    base = sim.sync_time(batches, 8, costs)
    assert half["speedup"] == pytest.approx(base / sim.async_time(batches, 4, 4, costs, 1, False, True), rel=1e-12)
    pushed = sim.split_rows(batches, [(4, 4)], costs, k=1, push=1.0)
    assert all(p["speedup"] < r["speedup"] for p, r in zip(pushed, [r for r in rows if r["gen"] == 4], strict=True))
    table = sim.split_table(rows)
    assert len([line for line in table if line.startswith("| 8 |")]) == 7
    best = max((r for r in rows if (r["schedule"], r["old_pass"]) == ("async k=1", False)), key=lambda r: r["speedup"])
    assert f"async k=1 (without old pass) {best['gen']} + {best['train']}: {best['speedup']:.2f}x" in table[-1]
