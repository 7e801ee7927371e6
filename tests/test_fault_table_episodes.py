"""The fault table's episode rows (issue 36): environments that raise and tools that always fail, through the real CLI.

A third party's components that fail on purpose are installed into each ``rlzoo`` subprocess as a distribution would
be (a ``.dist-info`` folder with its ``entry_points.txt`` beside the module, on ``PYTHONPATH``: what pip writes, with
nothing built), so the run finds them through the entry-point group and names their distribution,
``rlzoo-faulty-plugins``: the environments ``raising`` and ``raising-tools`` (``KeyError`` in ``reset`` or ``step``),
the tools ``fails`` (raises) and ``hangs`` (sleeps past its budget) and the rollout engine ``scripted-turns`` (the
tiny model's log-probs of a scripted text, so that every episode reaches its environment whatever the model says).

Each case must end with its exit code, no traceback, and the component named with its distribution; the run's
files say what was counted. The rules behind them are tested in-process below (fast).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from test_cli import _rlzoo_command
from test_episodes import TOK, ScriptedEngine, ScriptedEnv, obs, run
from test_fault_table import BASE, Case, _environment, merge

from rlzoo.episodes import faults as episode_faults
from rlzoo.episodes.runner import EpisodeRunner
from rlzoo.interfaces import Observation, Verdict
from rlzoo.reporting.console import fault_summary
from rlzoo.runtime.faults import FaultPolicy, StepFailure
from rlzoo.tools import ToolOutcome, failing_tools, run_tool_calls
from rlzoo.util.reductions import FailedEpisodes, Sum, reduce_minibatches

pytestmark = pytest.mark.timeout(900)

DIST = "rlzoo-faulty-plugins"
PLUGIN = '''
"""A third party's components that fail on purpose (tests/test_fault_table_episodes.py)."""

import time
from typing import Literal

import torch
from pydantic import Field

import rlzoo
from rlzoo.engines import Generation
from rlzoo.engines.hf_rollout import HFRolloutEngine
from rlzoo.interfaces import Environment, Params, Tool


class Raising(Environment):
    """Raises KeyError in reset or in step (a test environment)."""

    name = "raising"

    class Params(Params):
        where: Literal["reset", "step"] = "step"

    def reset(self, sample):
        if self.params.where == "reset":
            raise KeyError("episode-state")
        return None

    def step(self, state, sample, text):
        raise KeyError("tool-result")


class RaisingTools(Raising):
    """Raises KeyError in reset or in step; given the run's tools and parser (a test environment)."""

    name = "raising-tools"
    uses_tools = True


class Fails(Tool):
    """Raises on every call (a test tool)."""

    name = "fails"
    description = "always fails"

    def call(self, arguments):
        raise RuntimeError("boom")


class Hangs(Tool):
    """Sleeps far past its time budget on every call (a test tool)."""

    name = "hangs"
    description = "never answers in time"

    class Params(Params):
        timeout_s: float = Field(0.2, gt=0)
        sleep_s: float = Field(60.0, gt=0)

    def call(self, arguments):
        time.sleep(self.params.sleep_s)
        return "late"


class ScriptedTurns(HFRolloutEngine):
    """The tiny model's log-probs of scripted turns (a test engine): first, then later once a call was made."""

    name = "scripted-turns"
    can_record_routing = False

    class Params(HFRolloutEngine.Params):
        first: str = "1"
        later: str = "1"

    def start(self, context):
        from transformers import AutoTokenizer

        super().start(context)
        self.tokenizer = AutoTokenizer.from_pretrained(context.model_dir)

    @torch.no_grad()
    def generate(self, prompts, sampling):
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            said = self.params.later if "<tool_call>" in text else self.params.first
            full = list(self.tokenizer(said, add_special_tokens=False)["input_ids"]) + [self.context.eos_token_id]
            ids = full[: sampling.max_new_tokens]
            logits = self.model(input_ids=torch.tensor([list(prompt) + ids])).logits[0, len(prompt) - 1 : -1].float()
            logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist()
            out.append([Generation(list(prompt), ids, logprobs, len(ids) == len(full)) for _ in range(sampling.n)])
        return out


@rlzoo.hookimpl
def rlzoo_environments():
    return [Raising, RaisingTools]


@rlzoo.hookimpl
def rlzoo_tools():
    return [Fails, Hangs]


@rlzoo.hookimpl
def rlzoo_rollout_engines():
    return [ScriptedTurns]
'''


def install(site: Path) -> Path:
    """``rlzoo-faulty-plugins`` as pip would leave it in ``site``: the module and its ``.dist-info``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "rlzoo_faulty_plugins.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "rlzoo_faulty_plugins-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rlzoo]\nfaulty = rlzoo_faulty_plugins\n")
    return site


# -- the cases ---------------------------------------------------------------------------------------------------

SCRIPTED = {"name": "scripted-turns"}
CALLS = '<tool_call>{"name":"fails"}</tool_call><tool_call>{"name":"hangs"}</tool_call>'


def train(extra: dict):
    def setup(folder: Path, ctx: object) -> list[str]:
        (folder / "run.yaml").write_text(yaml.safe_dump(merge(BASE, extra)))
        return ["train", "run.yaml"]

    return setup


ENV_STEP = "environment 'raising-tools' (rlzoo-faulty-plugins) raised KeyError: 'tool-result' in step"
ENV_RESET = "environment 'raising' (rlzoo-faulty-plugins) raised KeyError: 'episode-state' in reset"

CASES = [
    # raises in step on every call: in the cold start's demonstrations (half of them call the tool), its evaluation,
    # the step-0 evaluation, the training step and the final evaluation; one warning, the run completes
    Case(
        "environment-raises-in-step",
        train(
            {
                "task": {"name": "calculator-arithmetic", "tool_demonstrations": 0.5},
                "rollout": {"engine": SCRIPTED},
                "episode": {
                    "environment": {"name": "raising-tools"},
                    "tools": [{"name": "calculator"}],
                    "max_turns": 2,
                },
            }
        ),
        (ENV_STEP, "that demonstration is left out of the cold start", "environment errors: 4 training and 8 held-out"),
        code=0,
        once=ENV_STEP,
        one_error=False,
    ),
    # raises in reset: every episode of every step fails, and the failure policy stops the run in one line
    Case(
        "environment-raises-in-reset-every-step",
        train(
            {
                "rollout": {"engine": SCRIPTED},
                "train": {"steps": 3, "max_consecutive_failures": 2},
                "episode": {"environment": {"name": "raising", "where": "reset"}, "max_turns": 2},
            }
        ),
        (
            ENV_RESET,
            "that episode ends there with reward 0, counted in episode/errors and env/raising/errors",
            "error: stopped at step 1 after 2 failed steps in a row (train.max_consecutive_failures: 2): every one of the "
            "4 episodes failed in its environment (env/raising/errors 4); the last checkpoint, "
            "out/checkpoints/step_000001, is intact",
        ),
        once=ENV_RESET,
    ),
    # raises on every demonstration the cold start replays: nothing to train on, one line
    Case(
        "environment-fails-every-demonstration",
        train(
            {
                "task": {"name": "calculator-arithmetic", "tool_demonstrations": 1.0},
                "episode": {
                    "environment": {"name": "raising-tools"},
                    "tools": [{"name": "calculator"}],
                    "max_turns": 2,
                },
            }
        ),
        (
            "error: the cold start has nothing to train on: the environment failed on all 32 of its demonstrations "
            f"({ENV_STEP}); fix it, or start from a trained model (model.path)",
        ),
    ),
    # every call of one tool raises, every call of the other times out: one warning each, the run completes
    Case(
        "tools-always-fail-or-time-out",
        train(
            {
                "model": {"tiny": {"max_position_embeddings": 512}},
                "task": {"name": "calculator-arithmetic", "tool_demonstrations": 0.0},
                "rollout": {"engine": {**SCRIPTED, "first": CALLS}, "max_new_tokens": 96},
                "episode": {
                    "environment": {"name": "tools"},
                    "tools": [{"name": "fails"}, {"name": "hangs"}],
                    "max_turns": 2,
                },
            }
        ),
        (
            "tool 'fails' (rlzoo-faulty-plugins): all 4 of its calls in a batch of episodes failed (4 errors, 0 timeouts; "
            "the first: Error: fails failed: RuntimeError: boom)",
            "tool 'hangs' (rlzoo-faulty-plugins): all 4 of its calls in a batch of episodes failed (0 errors, 4 timeouts; "
            "the first: Error: hangs timed out after 0.2 s)",
            "abandoned tool calls: 4 in training ran past their time budget and were left running (tool/abandoned)",
        ),
        code=0,
        one_error=False,
    ),
]


def _run(case: Case, folder: Path, site: Path) -> subprocess.CompletedProcess:
    argv = case.setup(folder, None)
    env = _environment()
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"  # the tiny model's matmuls are microseconds: a thread pool only makes them wait
    return subprocess.run([*_rlzoo_command(), *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    site = install(tmp_path_factory.mktemp("site"))
    jobs = [(case, tmp_path_factory.mktemp(case.id)) for case in CASES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(lambda job: _run(*job, site), jobs))
    return {case.id: (folder, proc) for (case, folder), proc in zip(jobs, procs, strict=True)}


def _shown(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_faulty_episodes_through_the_real_cli(results, case: Case):
    folder, proc = results[case.id]
    output = proc.stdout + proc.stderr
    assert proc.returncode == case.code, _shown(proc)
    assert "Traceback" not in output, _shown(proc)
    for text in case.expect:
        assert text in output, f"{text!r} missing; {_shown(proc)}"
    assert DIST in output  # the component's distribution is named
    if case.once is not None:
        assert output.count(case.once) == 1, f"{case.once!r} not exactly once; {_shown(proc)}"
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == (1 if case.one_error else 0), _shown(proc)


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]


def test_an_environment_raising_in_step_costs_its_episodes_not_the_run(results):
    folder, proc = results["environment-raises-in-step"]
    rows = _rows(folder)
    step = next(r for r in rows if "reward/mean" in r)
    assert step["episode/errors"] == 4 and step["env/raising-tools/errors"] == 4  # every episode of the step
    assert step["reward/mean"] == 0.0 and step["response/finished_fraction"] == 0.0
    evaluations = [r for r in rows if "eval/accuracy" in r]
    assert [r["eval/episode_errors"] for r in evaluations] == [4, 4]
    assert all(r["eval/accuracy"] == 0 for r in evaluations)
    cold = json.loads((folder / "out" / "cold_start" / "cold_start.json").read_text())
    assert 0 < cold["demonstration_errors"] < 32  # those that call the tool (the cold start's own evaluation samples
    # with hf, whose untrained turns end at max_new_tokens: its episodes never reach the environment)
    # the step failed (every episode did) and was ridden out: one of train.max_consecutive_failures (3)
    ridden_out = "step 0 failed (1 in a row of at most 3): every one of the 4 episodes failed in its environment"
    assert ridden_out in proc.stderr
    assert "further failures are counted, not shown" in proc.stderr
    assert "the traceback of that failure" in (folder / "out" / "log.txt").read_text()  # for whoever debugs it


def test_the_run_stopped_by_failing_episodes_kept_its_last_good_record(results):
    folder, _ = results["environment-raises-in-reset-every-step"]
    rows = _rows(folder)
    assert [r["step"] for r in rows if "reward/mean" in r] == [0, 1]  # logged, then stopped before its checkpoint
    assert all(r["env/raising/errors"] == 4 for r in rows if "reward/mean" in r)
    assert (folder / "out" / "checkpoints" / "step_000001").is_dir()
    assert not (folder / "out" / "checkpoints" / "step_000002").exists()


def test_the_failing_cold_start_wrote_no_model(results):
    folder, _ = results["environment-fails-every-demonstration"]
    assert not (folder / "out" / "cold_start" / "cold_start.json").exists()


def test_failing_tools_are_counted_and_their_abandoned_threads_reported(results):
    folder, proc = results["tools-always-fail-or-time-out"]
    step = next(r for r in _rows(folder) if "reward/mean" in r)
    assert (step["tool/fails/calls"], step["tool/fails/errors"]) == (4, 4)
    assert (step["tool/hangs/calls"], step["tool/hangs/timeouts"], step["tool/abandoned"]) == (4, 4, 4)
    assert "episode/errors" not in step  # the environment itself never failed: the model read the errors
    for name in ("fails", "hangs"):
        assert proc.stderr.count(f"tool '{name}' ({DIST})") == 1  # once: in the step-0 evaluation, not again
    assert "thread(s) still running now" in proc.stdout


# -- the rules in-process ----------------------------------------------------------------------------------------


@pytest.fixture
def fresh_notices(monkeypatch):
    """No component named on the console yet (the notices are once per process)."""
    monkeypatch.setattr(episode_faults, "_named", set())


class Failing(ScriptedEnv):
    name = "failing"

    def __init__(self, answers, fail_reset=(), fail_step=(), answer=None):
        super().__init__(answers)
        self.fail_reset, self.fail_step, self.answer = set(fail_reset), set(fail_step), answer

    def reset(self, sample):
        if sample.prompt in self.fail_reset:
            raise KeyError("state")
        return super().reset(sample)

    def step(self, state, sample, text):
        if sample.prompt in self.fail_step:
            if self.answer is not None:
                return self.answer
            raise ValueError("bad\nturn")
        return super().step(state, sample, text)


ENGINE = ScriptedEngine(lambda text, i: "ans$" if text.endswith("R\n") else "call$")


def test_failed_episodes_end_with_reward_zero_and_are_counted(fresh_notices, caplog):
    env = Failing({"call": obs("R", reward=0.5), "ans": Observation(done=True, reward=1.0)}, ["B:"], ["C:"])
    runner = EpisodeRunner(env, TOK, max_turns=3, max_tokens=100, distributions={("environment", "failing"): "dist"})
    with caplog.at_level(logging.INFO, logger="rlzoo.episodes.faults"):
        ran = run(runner, ENGINE, ["A:", "B:", "C:"], n=2)
    (a1, a2), (b1, b2), (c1, c2) = ran.groups
    assert a1.turn_rewards == [0.5, 1.0] and a1.finished  # the others are not touched
    for g in (b1, b2):  # reset raised: the episode is its first turn
        assert len(g.turns) == 1 and g.turn_rewards == [0.0] and not g.finished and not g.truncated
    for g in (c1, c2):  # step raised on the first turn's answer
        assert len(g.turns) == 1 and g.turn_rewards == [0.0] and not g.finished
    assert set(ran.errors) == {2, 3, 4, 5}
    assert ran.errors[2] == "environment 'failing' (dist) raised KeyError: 'state' in reset"
    assert ran.errors[4] == "environment 'failing' (dist) raised ValueError: bad turn in step"  # one line
    metrics = ran.metrics
    assert (metrics["episode/errors"], type(metrics["episode/errors"])) == (4.0, Sum)
    assert (metrics["env/failing/errors"], type(metrics["env/failing/errors"])) == (4.0, FailedEpisodes)
    verdicts = ran.scored([Verdict(1.0)] * 6)  # whatever the verifier says
    assert [v.reward for v in verdicts] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0] and verdicts[2].reason == ran.errors[2]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{ran.errors[2]}: that episode ends there with reward 0, counted in episode/errors and "
        "env/failing/errors; further failures are counted, not shown"
    ]
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.INFO)  # the traceback, for the log file
    caplog.clear()
    run(runner, ENGINE, ["B:"])
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]  # named once


def test_a_run_without_faults_logs_no_fault_keys():
    env = ScriptedEnv({"call": obs("R"), "ans": Observation(done=True)})
    ran = run(EpisodeRunner(env, TOK, max_turns=3, max_tokens=100), ENGINE, ["A:"], n=2)
    assert ran.errors == {} and not {"episode/errors", "env/scripted/errors", "tool/abandoned"} & set(ran.metrics)
    verdicts = [Verdict(1.0), Verdict(0.0)]
    assert ran.scored(verdicts) is verdicts


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"done": True}, "answered step with a dict, not an Observation"),
        (Observation(done=True, reward=float("nan")), "answered step with a reward that is not finite (nan)"),
        (Observation(done=True, reward="high"), "answered step with a reward that is not a number ('high')"),
        (Observation(messages=["text"]), "answered step with messages that are not a list of mappings"),
        (Observation(tool_outcomes=[{"status": "ok"}]), "answered step with tool_outcomes that are not a list of"),
    ],
)
def test_an_answer_that_is_not_an_observation_fails_the_episode(fresh_notices, answer, problem):
    env = Failing({}, fail_step=["A:"], answer=answer)
    ran = run(EpisodeRunner(env, TOK, max_turns=2, max_tokens=100), ENGINE, ["A:"])
    assert ran.errors[0].startswith(f"environment 'failing' {problem}")


def test_every_failed_episode_fails_the_step_by_its_declaration(tmp_path):
    policy = FaultPolicy(2, 4, tmp_path)
    assert policy.failure({"episode/errors": Sum(4.0), "env/x/errors": FailedEpisodes(3.0)}) is None  # 3 of 4
    assert policy.failure({"env/x/errors": 4.0}) is None  # a plain number is never a fault, whatever its key
    every = {"episode/errors": Sum(4.0), "env/x/errors": FailedEpisodes(4.0)}
    assert policy.failure(every) == "every one of the 4 episodes failed in its environment (env/x/errors 4)"
    policy.check(0, every)
    with pytest.raises(StepFailure, match=r"stopped at step 1 after 2 failed steps in a row .*env/x/errors 4"):
        policy.check(1, every)
    # the counts of a step's generation batches (and ranks' shares) add up, keeping the declaration
    combined = reduce_minibatches([{"env/x/errors": FailedEpisodes(1.0)}, {"env/x/errors": FailedEpisodes(3.0)}])
    assert type(combined["env/x/errors"]) is FailedEpisodes and combined["env/x/errors"] == 4.0


def test_a_tool_is_named_once_when_every_call_of_a_batch_failed(fresh_notices, caplog):
    fail = ToolOutcome("calculator", "error", "Error: calculator failed: RuntimeError: boom")
    late = ToolOutcome("calculator", "timeout", "Error: calculator timed out after 1 s", abandoned=True)
    ok = ToolOutcome("calculator", "ok", "4")
    assert failing_tools([fail, late, ToolOutcome("", "malformed", "Error: x")]) == {"calculator": [fail, late]}
    assert failing_tools([fail, ok]) == {} and failing_tools([]) == {}
    env = ScriptedEnv({"call": obs("R", tool_outcomes=[fail, late]), "ans": Observation(done=True)})
    env.tools = {"calculator": None}
    runner = EpisodeRunner(env, TOK, max_turns=3, max_tokens=100, distributions={("tool", "calculator"): "rlzoo-tools"})
    with caplog.at_level(logging.WARNING, logger="rlzoo.episodes.faults"):
        ran = run(runner, ENGINE, ["A:"], n=2)
        run(runner, ENGINE, ["A:"], n=2)
    assert ran.metrics["tool/abandoned"] == 2.0 and type(ran.metrics["tool/abandoned"]) is Sum
    assert [r.getMessage() for r in caplog.records] == [
        "tool 'calculator' (rlzoo-tools): all 4 of its calls in a batch of episodes failed (2 errors, 2 timeouts; the "
        "first: Error: calculator failed: RuntimeError: boom); the model reads each failure as the call's result; "
        "counted in tool/calculator/errors and tool/calculator/timeouts, not shown again"
    ]


def test_a_call_past_its_budget_is_marked_abandoned():
    import threading

    from rlzoo.interfaces import Tool, ToolCall

    release = threading.Event()

    class Stuck(Tool):
        name = "stuck"
        default_timeout_s = 0.05

        def call(self, arguments):
            release.wait(10)
            return "late"

    try:
        (outcome,) = run_tool_calls([ToolCall("stuck", {})], {"stuck": Stuck()})
        assert outcome.status == "timeout" and outcome.abandoned
    finally:
        release.set()
    (done,) = run_tool_calls([ToolCall("stuck", {})], {"stuck": Stuck()})
    assert done.status == "ok" and not done.abandoned


def test_the_final_summary_reports_the_faults_it_rode_out(monkeypatch):
    import rlzoo.tools

    monkeypatch.setattr(rlzoo.tools, "abandoned_calls", lambda: 0)
    assert fault_summary([{"step": 0, "reward/mean": 0.5}, {"step": 1, "eval/accuracy": 0.5}]) == []
    rows = [
        {"step": 0, "eval/episode_errors": 2.0, "episode/errors": 4.0, "tool/abandoned": 1.0},
        {"step": 1, "episode/errors": 1.0, "tool/abandoned": 2.0},
    ]
    lines = fault_summary(rows)
    assert lines[0].startswith("environment errors: 5 training and 2 held-out episodes ended with reward 0")
    assert lines[1].startswith("abandoned tool calls: 3 in training ran past their time budget")
    assert "0 thread(s) still running now" in lines[1]


def test_a_demonstration_the_environment_fails_on_is_left_out(fresh_notices, caplog, monkeypatch):
    from rlzoo.config.resolution import build_config
    from rlzoo.errors import RlzooError
    from rlzoo.models import build_char_tokenizer
    from rlzoo.registry import default_registry
    from rlzoo.runtime.cold_start import _demonstrations

    def broken(self, state, sample, text):
        raise ConnectionError("sandbox gone")

    registry = default_registry()
    monkeypatch.setattr(type(registry.create("environment", "tools")), "step", broken)

    def demonstrations(share: float) -> tuple[list, int]:
        task = {"name": "calculator-arithmetic", "tool_demonstrations": share}
        episode = {"environment": {"name": "tools"}, "tools": [{"name": "calculator"}], "max_turns": 2}
        config = build_config({"task": task, "cold_start": {"examples": 16}, "episode": episode}, registry=registry)
        task = registry.create("task", "calculator-arithmetic", config.task.params)
        calling = sum(len(s.demonstration_turns) == 2 for s in task.samples("train", 16, config.seed))
        examples, left_out = _demonstrations(config, task, build_char_tokenizer(task.alphabet()), registry)
        assert (len(examples), left_out) == (16 - calling, calling)  # the direct answers never reach step
        return examples, left_out

    first = "environment 'tools' (rlzoo-tools) raised ConnectionError: sandbox gone in step"
    with caplog.at_level(logging.WARNING, logger="rlzoo.episodes.faults"):
        assert 0 < demonstrations(0.5)[1] < 16
    assert [r.getMessage() for r in caplog.records] == [
        f"{first}: that demonstration is left out of the cold start, counted in cold_start.json's "
        "demonstration_errors; further failures are counted, not shown"
    ]
    with pytest.raises(RlzooError) as failed:
        demonstrations(1.0)
    assert str(failed.value) == (
        f"the cold start has nothing to train on: the environment failed on all 16 of its demonstrations ({first}); "
        "fix it, or start from a trained model (model.path)"
    )
