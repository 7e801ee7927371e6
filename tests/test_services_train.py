"""A reward service inside ``rlzoo train``: the run hands the verifier its folder (the reply cache lives there),
the ``remote/*`` counts reach metrics.jsonl, and a service that answers its health check but fails every scoring
stops the run after ``train.max_consecutive_failures`` steps with one line (in process; a real server on loopback)."""

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
            "train": {"steps": 4, "eval_every": 10, "eval_prompts": 4, "checkpoint_every": 1,
                      "max_consecutive_failures": 2},
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
