"""A reward service inside ``rlzoo train``: the run hands the verifier its folder (the reply cache lives there),
the ``remote/*`` counts reach metrics.jsonl, and a service that answers its health check but fails every scoring
stops the run after ``train.max_consecutive_failures`` steps with one line; the held-out evaluations' scoring is
counted as ``eval/remote_*`` and in the final summary (in process; a real server on loopback)."""

from __future__ import annotations

import json

import yaml
from service_testlib import faulty_app, serving

from rlzoo.cli import main


def test_a_service_failing_every_scoring_stops_the_run_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with serving(faulty_app()) as url:
        config = {
            "output_dir": "out",
            "rollout": {"engine": {"name": "hf"}, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
            "trainer": {"engine": {"name": "torch"}},
            "cold_start": {"steps": 2, "batch_size": 8, "examples": 32},
            "train": {
                "steps": 4,
                "eval_every": 10,
                "eval_prompts": 4,
                "checkpoint_every": 1,
                "max_consecutive_failures": 2,
            },
            "verifier": {"name": "remote", "url": f"{url}/always500", "health_url": f"{url}/health", "retries": 0},
        }
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
        assert main(["train", "run.yaml"]) == 1
    err = capsys.readouterr().err
    stop = [line for line in err.splitlines() if line.startswith("error: ")]
    assert stop == [
        "error: stopped at step 1 after 2 failed steps in a row (train.max_consecutive_failures: 2): none of the 4 "
        "responses could be scored (verifier/errors 4, verifier/timeouts 0, verifier/nonfinite_rewards 0); the last "
        "checkpoint, out/checkpoints/step_000001, is intact: fix the cause, then continue with "
        "`rlzoo train CONFIG --resume out`"
    ], err[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "remote/requests" in row]
    assert trained and all(row["remote/failures"] == row["remote/requests"] == 1 for row in trained), rows
    assert (tmp_path / "out" / "service_cache.sqlite").is_file()  # the run folder was handed over


def test_evaluations_scoring_cost_is_in_the_metrics_and_the_final_summary(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    app = faulty_app()
    with serving(app) as url:
        config = {
            "output_dir": "out",
            "rollout": {"engine": {"name": "hf"}, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
            "trainer": {"engine": {"name": "torch"}},
            "cold_start": {"steps": 2, "batch_size": 8, "examples": 32},
            "train": {
                "steps": 1,
                "eval_every": 1,
                "eval_prompts": 3,
                "eval_samples_per_prompt": 2,
                "eval_temperature": 1.0,
            },
            "verifier": {"name": "remote", "url": f"{url}/ok", "health_url": f"{url}/health", "batch_size": 2},
        }
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
        assert main(["train", "run.yaml"]) == 0
        posts = app.state.calls["/ok"]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    evals = [row for row in rows if "eval/accuracy" in row]
    assert [row["step"] for row in evals] == [0, 1]
    for row in evals:  # 6 held-out responses, 2 a request: asked or answered by the cache
        assert 2 * row["eval/remote_requests"] + row["eval/remote_cache_hits"] == 6, row
        assert row["eval/remote_failures"] == row["eval/remote_retries"] == 0
        assert "remote/requests" not in row or "reward/mean" in row  # the training counters stay the steps'
    assert any("eval/remote_latency_p50_s" in row for row in evals)
    # every POST the service got is counted once: by a training step, an evaluation, or the cold start's evaluation
    # of the model it saved (in its cold_start.json)
    trained = sum(row.get("remote/requests", 0) for row in rows)
    held_out = sum(row.get("eval/remote_requests", 0) for row in rows)
    [cold] = [json.loads(path.read_text()) for path in tmp_path.rglob("cold_start.json")]
    assert trained + held_out + cold["eval_remote_requests"] == posts and held_out > 0
    out = capfd.readouterr()  # the console writes to the terminal's own descriptors
    summary = [line.strip() for line in (out.out + out.err).splitlines() if line.strip().startswith("scoring (remote")]
    hits = sum(row.get("eval/remote_cache_hits", 0) for row in rows)
    assert summary == [
        f"scoring (remote, training steps): {trained:g} requests, "
        f"{sum(row.get('remote/cache_hits', 0) for row in rows):g} cache hits, 0 retries, 0 failed",
        f"scoring (remote, held-out evaluations): {held_out:g} requests, {hits:g} cache hits, 0 retries, 0 failed",
    ], out.err[-2000:]
