"""``rlzoo check-verifier CONFIG PAIRS``: pairwise accuracy of a config's verifier, in process. The ``regex``
verifier (no service) and the ``judge`` verifier against a judge server of the test's own (FastAPI on loopback:
9 for a response with "please", else 2), a file with a bad line, and an endpoint that answers nothing."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import yaml
from cli_testlib import run_cli
from service_testlib import serving
from test_services_judge import fake_judge

from rlzoo.interfaces import Sample
from rlzoo.verifier_check import Pair, summarise

TASK = {"name": "arithmetic", "digits": 1}


def write(folder: Path, verifier: dict, pairs: list[dict]) -> None:
    config = {"seed": 0, "output_dir": "runs/x", "model": {"tiny": {}}, "task": TASK, "verifier": verifier}
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    (folder / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))


def test_regex_pairs_win_lose_and_tie_per_kind(tmp_path):
    pairs = [
        {"prompt": "2+2?", "chosen": "4", "rejected": "four", "kind": "words"},
        {"prompt": "3+3?", "chosen": "6", "rejected": "six", "kind": "words"},
        {"prompt": "1+1?", "chosen": "2", "rejected": "3", "kind": "wrong number"},  # both match: a tie
        {"prompt": "1+2?", "chosen": "three", "rejected": "3", "kind": "wrong number"},  # the worse one wins
    ]
    write(tmp_path, {"name": "regex", "pattern": "[0-9]+"}, pairs)
    result = run_cli(["check-verifier", "run.yaml", "pairs.jsonl"], tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert "| 2 | 1.000 [1.000, 1.000] | 0 | 1.000 | 0.000 |" in rows["words"]
    assert "| 2 | 0.250 [0.000, 0.500] | 1 | 0.500 | 1.000 |" in rows["wrong number"]
    assert "| 4 | 0.625 " in rows["all"]


def test_the_judge_is_asked_over_http_and_its_scores_compared(tmp_path):
    with serving(fake_judge()) as url:
        judge = {"name": "judge", "base_url": f"{url}/v1", "model": "fake", "rubric": "Rate: {response}"}
        pairs = [{"prompt": "Ask them to sit.", "chosen": "Please sit.", "rejected": r} for r in ("Sit.", "Go.")]
        pairs.append({"prompt": "Ask them to sit.", "chosen": "Sit.", "rejected": "Please sit."})
        write(tmp_path, judge, pairs)
        result = run_cli(["check-verifier", "run.yaml", "pairs.jsonl"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "verifier judge" in result.stdout
    assert (
        "| all | 3 | 0.667 " in result.stdout and "| 0.667 | 0.433 |" in result.stdout
    )  # 0.9, 0.9, 0.2 against 0.2, 0.2, 0.9


def test_a_bad_line_is_named_with_its_field(tmp_path):
    write(tmp_path, {"name": "regex", "pattern": "x"}, [{"prompt": "p", "chosen": "x", "rejected": "y"}])
    with (tmp_path / "pairs.jsonl").open("a") as f:
        f.write('{"prompt": "p", "chosen": "x"}\n')
    result = run_cli(["check-verifier", "run.yaml", "pairs.jsonl"], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "pairs.jsonl line 2 has no 'rejected'" in result.stderr


def test_a_judge_that_answers_nothing_is_named_before_any_pair_is_scored(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    judge = {"name": "judge", "base_url": f"http://127.0.0.1:{port}/v1", "model": "m", "timeout_s": 2.0}
    write(tmp_path, judge, [{"prompt": "p", "chosen": "x", "rejected": "y"}])
    result = run_cli(["check-verifier", "run.yaml", "pairs.jsonl"], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "verifier.base_url" in result.stderr and f"127.0.0.1:{port}" in result.stderr


def test_the_interval_holds_the_accuracy_and_narrows_with_more_pairs():
    def scored(wins: int, n: int):
        pair = Pair(Sample("p", ""), "a", "b", "k")
        return [(pair, 1.0, 0.0)] * wins + [(pair, 0.0, 1.0)] * (n - wins)

    small, large = summarise("k", scored(6, 10)), summarise("k", scored(60, 100))
    assert small.accuracy == large.accuracy == 0.6
    assert small.low < 0.6 < small.high and large.low < 0.6 < large.high
    assert (large.high - large.low) < (small.high - small.low)
    assert np.isclose(large.high - large.low, 2 * 1.96 * np.sqrt(0.6 * 0.4 / 100), atol=0.03)  # the normal width
