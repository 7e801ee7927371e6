"""A third party's tool, pip-installed into a fresh virtual environment, is called by name in multi-turn episodes
of a real ``rlzoo train`` run (docs/multi-turn.md).

The distribution ``rlzoo-wordcount-tool`` is the real source tree ``tests/third_party_tool`` (copied to a temporary
folder first, so no build artefacts land in the repository), installed into the session's venv layered over the
test environment (tests/venv_testlib.py). It registers the tool ``word-count`` (a JSON schema with one
``text`` argument; each call appends a line to its ``log_path``) and the rollout engine ``word-count-caller``
(transformers generate, except that every episode's first turn is a scripted ``hermes`` call of ``word-count``), so
the episode loop of the first-party ``tools`` environment parses the call, runs the third-party tool found through
its entry point, appends its observation's tokens and samples the second turn, with no model trained to call it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from test_cli import TINY_RUN
from test_third_party_plugin import rlzoo_cli
from venv_testlib import PluginVenv

pytestmark = pytest.mark.timeout(300)

DIST = "rlzoo-wordcount-tool"
TEXT = "one two three four"  # what every scripted call asks word-count to count
OBSERVATION = "<tool_response>\n4 words\n</tool_response>\n"  # its result as hermes shows it in plain text


@pytest.fixture
def venv(plugin_venv: PluginVenv) -> Path:
    """The session's venv (tests/conftest.py), with ``rlzoo-wordcount-tool`` installed; its python."""
    plugin_venv.assert_installed_here("rlzoo_wordcount_tool")
    return plugin_venv.python


def test_the_tool_is_listed_with_its_distribution(venv, tmp_path):
    proc = rlzoo_cli(venv, "plugins", "list", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(proc.stdout)}
    for key in (("tool", "word-count"), ("rollout_engine", "word-count-caller")):
        assert rows[key]["distribution"] == DIST and rows[key]["plugin"] == "wordcount-tool", rows.get(key)
        assert rows[key]["duplicate"] is False
    assert {("tool", "calculator"), ("environment", "tools"), ("tool_parser", "hermes")} <= set(rows)


def test_an_episode_calls_the_third_party_tool_through_the_real_cli(venv, tmp_path):
    run_dir, calls, transcript = tmp_path / "run", tmp_path / "calls.jsonl", tmp_path / "transcript.jsonl"
    config = {
        "output_dir": str(run_dir),
        "model": {"tiny": {"architecture": "qwen3"}},
        # every printable character is in the tiny tokenizer; no demonstration calls a tool (calculator is not here)
        "task": {"name": "calculator-arithmetic", "tool_demonstrations": 0.0},
        "rollout": {"engine": {"name": "word-count-caller", "text": TEXT, "transcript_path": str(transcript)}},
        "trainer": {"engine": {"name": "torch"}},
        "episode": {
            "environment": {"name": "tools"},
            "tools": [{"name": "word-count", "log_path": str(calls)}],
            "max_turns": 2,
            "max_tokens": 160,
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    # the scripted call is ~80 tokens: each turn may take 96 (the episode budget, 160, still bounds the second)
    overrides = [*TINY_RUN, "rollout.max_new_tokens=96"]
    # one intra-op thread: the tiny model's matmuls are microseconds, and on a busy machine with few cores torch's
    # thread pool makes each one wait for the others (tens of milliseconds a forward); the run itself is unchanged
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = rlzoo_cli(venv, "train", path, *[a for o in overrides for a in ("--set", o)], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rollout word-count-caller, trainer torch" in proc.stdout

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "reward/mean" in r)
    episodes = 2 * 2  # rollout.prompts_per_step x rollout.group_size
    # every episode: the scripted call, the tool's observation, a sampled second turn (the last: max_turns 2)
    assert step["episode/turns_mean"] == 2.0
    # the observation's ids appended as they are: the character tokenizer gives one token per character
    assert step["episode/observation_tokens_mean"] == len(OBSERVATION)
    assert 0.0 <= step["episode/truncated"] <= 1.0
    assert step["tool/calls"] == episodes and step["tool/calls_per_episode"] == 1.0
    assert step["tool/word-count/calls"] == episodes
    assert step["tool/errors"] == 0.0 and step["tool/word-count/errors"] == 0.0 and step["tool/timeouts"] == 0.0
    evaluations = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evaluations] == [0, 1] and rows[-1].get("final") == 1.0
    for row in evaluations:  # held-out episodes are episodes too: one call each
        assert row["eval/episode_turns_mean"] == 2.0 and row["eval/tool_calls_per_episode"] == 1.0
        assert "eval/episode_truncated" in row

    # the tool really ran, in this process tree, through its entry point: its side effect, one line per call
    logged = [json.loads(line) for line in calls.read_text().splitlines()]
    assert logged and all(entry == {"text": TEXT, "words": 4} for entry in logged), logged[:3]
    assert len(logged) == episodes + 2 * 4  # the step's episodes + two evaluations of train.eval_prompts 4
    # and its observation was appended to the context of the second turn, right after the call's end-of-sequence
    seen = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert len(seen) == len(logged)
    assert all(f"</tool_call><eos>{OBSERVATION}" in text for text in seen), seen[0]
