"""``rlzoo serve-verifier``: a registered verifier over HTTP in rlzoo's protocol, scored through the ``remote``
verifier on loopback. The real command in a subprocess serves the ``code`` sandbox; in process, a verifier that
fails for some responses, a malformed request, and the message when the serve extra is missing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from service_testlib import serving

from rlzoo.cli import main
from rlzoo.interfaces import Sample, Verdict, Verifier
from rlzoo.registry import default_registry
from rlzoo.rl.scoring import score
from rlzoo.services.server import app_for

REPO = Path(__file__).resolve().parents[1]
FAST = {"backoff_s": 0.01, "timeout_s": 30.0, "retries": 1}
ADD = Sample("Write add(a, b).", "", meta={"tests": "assert add(2, 3) == 5\n"})
GOOD, BAD = "def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"


def remote(url: str, **params):
    return default_registry().create("verifier", "remote", {"url": url, **FAST, **params})


class Picky(Verifier):
    """1 for "yes", 0 for "no", raises for anything else, NaN for "nan"."""

    name = "picky"

    def verify(self, sample: Sample, response: str) -> Verdict:
        if response == "nan":
            return Verdict(float("nan"))
        if response not in ("yes", "no"):
            raise ValueError(f"cannot read {response!r}")
        return Verdict(float(response == "yes"), parts={"yes": float(response == "yes")}, reason=f"said {response}")


@pytest.fixture(scope="module")
def served_picky():
    with serving(app_for(Picky())) as url:
        yield url


def test_a_served_verifier_scores_through_remote_and_its_failures_are_errors_there(served_picky):
    samples = [Sample("q", "")] * 4
    scores = score(remote(f"{served_picky}/verify_batch"), samples, ["yes", "no", "what", "nan"])
    assert [v.reward for v in scores.verdicts] == [1.0, 0.0, 0.0, 0.0]
    assert scores.verdicts[0].parts == {"yes": 1.0} and scores.verdicts[0].reason == "said yes"
    assert scores.errors == 2  # the raise and the NaN, each an error on the server and so at the caller
    assert scores.metrics()["remote/failures"] == 2 and scores.metrics()["remote/requests"] == 1
    assert "cannot read 'what'" in scores.verdicts[2].reason and "not a finite number" in scores.verdicts[3].reason


def test_health_and_the_single_route_and_a_malformed_request_naming_its_field(served_picky):
    assert httpx.get(f"{served_picky}/health").json() == {"status": "ok", "verifier": "picky"}
    one = httpx.post(f"{served_picky}/verify", json={"prompt": "q", "response": "yes"}).json()
    assert one == {"reward": 1.0, "correct": True, "parts": {"yes": 1.0}, "info": {"reason": "said yes"}}
    bad = httpx.post(f"{served_picky}/verify_batch", json={"items": [{"prompt": "q"}]})
    assert bad.status_code == 422 and "response" in bad.text


def test_a_process_verifier_s_step_rewards_come_over_http_as_they_are_in_process():
    """The ``steps`` of rlzoo's protocol: each step's reward and its span in the response's characters (Unicode code
    points: a response with accents and an emoji keeps its offsets), for the ``process`` advantage."""
    process = default_registry().create("verifier", "process", {})
    chain = Sample("2+3, then *4, then -5: ", "15", meta={"steps": [5, 20, 15]})
    responses = ["5;20;15", " 5 ; 21;15", "5;20", "é5🙂;20;15", "", "5;20;15;9"]
    with serving(app_for(process)) as url:
        scores = score(remote(f"{url}/verify_batch", batch_size=4), [chain] * len(responses), responses)
    assert scores.errors == 0
    expected = [process.verify(chain, response) for response in responses]
    assert any(v.step_rewards for v in expected) and any(0.0 in (v.step_rewards or []) for v in expected)
    for got, want in zip(scores.verdicts, expected, strict=True):
        assert (got.reward, got.correct, got.step_rewards, got.step_spans, got.reason) == (
            want.reward,
            want.correct,
            want.step_rewards,
            want.step_spans,
            want.reason,
        )
    assert scores.verdicts[3].step_spans[0] == (0, 3) and "é5🙂;20;15"[0:3] == "é5🙂"


def test_missing_extra_says_which_to_install(tmp_path, monkeypatch, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("verifier: {name: exact}\n")
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if it were not installed
    assert main(["serve-verifier", str(config)]) == 1
    err = capsys.readouterr().err
    assert "pip install 'rlzoo[serve]'" in err and "fastapi is missing" in err and "Traceback" not in err


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_code_sandbox_served_in_process(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the sandboxes' folders, checked gone below
    code = default_registry().create("verifier", "code", {"timeout_s": 5.0, "memory_mb": 128})
    with serving(app_for(code)) as url:
        scores = score(remote(f"{url}/verify_batch"), [ADD, ADD], [GOOD, BAD])
    assert [v.reward for v in scores.verdicts] == [1.0, 0.0] and scores.errors == 0
    assert list(tmp_path.iterdir()) == []


def test_the_command_serves_the_code_sandbox(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("verifier: {name: code, timeout_s: 5.0, memory_mb: 128}\n")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlzoo.cli", "serve-verifier", str(config), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                assert httpx.get(f"{url}/health").json() == {"status": "ok", "verifier": "code"}
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "serve-verifier did not answer within 120 s"
                time.sleep(0.2)
        verifier = remote(f"{url}/verify_batch")
        assert verifier.preflight(None, "verifier") == []
        scores = score(verifier, [ADD, ADD], [GOOD, BAD])
        assert [v.reward for v in scores.verdicts] == [1.0, 0.0] and scores.errors == 0
    finally:
        proc.terminate()  # stopped by its handle on every exit path
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "serving verifier code on http://127.0.0.1:" in proc.stdout.read()
