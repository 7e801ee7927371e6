"""Multi-turn episodes (rlzoo.episodes.runner): one token sequence per episode with masked observations, batched turns,
limits and metrics, concurrent environments, the `tools` environment, loss equality with single-turn, process
advantages over turns, chat-template observations, cold-start demonstrations and config errors.

Fast, CPU only: a scripted rollout engine (it answers each context with given text and records every call) and
scripted environments; the real `calculator` tool, `hermes` parser, objective and a tiny model where it matters.
"""

from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import dataclass

import pytest
import torch
from test_cli import _rlzoo_command

from rlzoo.config.resolution import build_config
from rlzoo.config.schema import PromptConfig, RunConfig, TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext, Generation, RolloutEngine, SamplingSettings
from rlzoo.engines.tokens import make_token_batch
from rlzoo.episodes.assembly import build_episode_runner, create_tools, with_tool_descriptions
from rlzoo.episodes.prompts import prompt_ids
from rlzoo.episodes.runner import EpisodeRunner, chat_observation_text
from rlzoo.errors import ConfigError
from rlzoo.interfaces import Environment, Observation, Sample, Verdict, Verifier
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components
from rlzoo.rl.objective import build_objective
from rlzoo.rl.rollouts import collect, generate_and_score, turn_steps
from rlzoo.tools import ToolOutcome
from rlzoo.util.seeds import generation_seed
from rlzoo.util.timer import Timer

EOS = "$"


class CharTokenizer:
    """One token per character (its code point); ``$`` is the end-of-sequence token (dropped by a decode that
    skips special tokens)."""

    pad_token_id = 0
    eos_token = EOS
    eos_token_id = ord(EOS)
    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


TOK = CharTokenizer()


def ids(text: str, tokenizer=TOK) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def logprob(position: int) -> float:
    """The scripted engine's log-prob of the token it samples at absolute position ``position`` of a sequence."""
    return -(position + 1) / 1000


@dataclass
class Call:
    contexts: list[str]
    n: int
    seed: int | None
    max_new_tokens: int


class ScriptedEngine(RolloutEngine):
    """Answers the context ``text`` (decoded with its special tokens) with ``script[text][i]`` for the i-th of
    ``n`` samples (or ``script(text, i)``); a response is cut at ``max_new_tokens`` and is finished when it ends
    with end-of-sequence. Records every ``generate`` call."""

    name = "scripted"

    def __init__(self, script, tokenizer=TOK) -> None:
        super().__init__()
        self.script, self.tokenizer = script, tokenizer
        self.calls: list[Call] = []

    def respond(self, text: str, i: int) -> str:
        return self.script(text, i) if callable(self.script) else self.script[text][i]

    def generate(self, prompts, sampling: SamplingSettings):
        texts = [self.tokenizer.decode(list(p), skip_special_tokens=False) for p in prompts]
        self.calls.append(Call(texts, sampling.n, sampling.seed, sampling.max_new_tokens))
        out = []
        for prompt, text in zip(prompts, texts, strict=True):
            group = []
            for i in range(sampling.n):
                full = ids(self.respond(text, i), self.tokenizer)
                response = full[: sampling.max_new_tokens]
                finished = bool(response) and response[-1] == self.tokenizer.eos_token_id
                logps = [logprob(len(prompt) + t) for t in range(len(response))]
                group.append(Generation(list(prompt), response, logps, finished))
            out.append(group)
        return out


class ScriptedEnv(Environment):
    """Answers a turn's text with ``answers[text]``; records ``(episode id, text)`` of every step (the id is the
    per-episode state from :meth:`reset`)."""

    name = "scripted"

    def __init__(self, answers: dict[str, Observation], gives_turn_rewards: bool = False) -> None:
        super().__init__()
        self.answers = answers
        self.gives_turn_rewards = gives_turn_rewards
        self.seen: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        self.episodes = 0

    def reset(self, sample):
        with self.lock:
            self.episodes += 1
            return {"id": self.episodes, "prompt": sample.prompt}

    def step(self, state, sample, text):
        assert state["prompt"] == sample.prompt  # the episode's own state comes back
        with self.lock:
            self.seen.append((state["id"], text))
        return self.answers[text]


def obs(text: str, **kw) -> Observation:
    return Observation(messages=[{"role": "user", "content": text}], **kw)


def run(runner, engine, prompts, n=1, max_new_tokens=8, seed=1, prompt=None):
    sampling = SamplingSettings(n=n, max_new_tokens=max_new_tokens, seed=seed)
    return runner.run(engine, [Sample(p, "x") for p in prompts], sampling, prompt or PromptConfig())


def pieces(g: Generation, tokenizer=TOK) -> list[tuple[str, int]]:
    """The response as (text, mask) runs: turns (1) and observations (0) in order."""
    out: list[tuple[str, int]] = []
    for token, m in zip(g.response_ids, g.policy_mask, strict=True):
        if out and out[-1][1] == m:
            out[-1] = (out[-1][0] + [token], m)
        else:
            out.append(([token], m))
    return [(tokenizer.decode(t, skip_special_tokens=False), m) for t, m in out]


def values(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


# -- 1. one token sequence per episode -----------------------------------------------------------------------


def test_an_episode_is_one_token_sequence_with_masked_observations():
    env = ScriptedEnv({"call": obs("R1", reward=0.25), "ans": Observation(done=True, reward=0.5)})
    engine = ScriptedEngine({"Q:": ["call$"], "Q:call$R1\n": ["ans$"]})  # the 2nd turn sees exactly this context
    ran = run(EpisodeRunner(env, TOK, max_turns=4, max_tokens=100), engine, ["Q:"])
    ((g,),) = ran.groups
    assert g.prompt_ids == ids("Q:")  # untouched: the observations and later turns are response tokens
    assert g.response_ids == ids("call$") + ids("R1\n") + ids("ans$")
    assert g.policy_mask == [1] * 5 + [0] * 3 + [1] * 4
    assert g.turns == [(0, 5), (8, 12)]
    assert g.turn_rewards == [0.25, 0.5]
    # the engine's log-probs of the sampled tokens as sampled, 0 on the observation's tokens
    expected = [logprob(2 + t) if m else 0.0 for t, m in enumerate(g.policy_mask)]
    assert g.response_logprobs == pytest.approx(expected, abs=0)
    assert [lp for lp, m in zip(g.response_logprobs, g.policy_mask, strict=True) if not m] == [0.0] * 3
    assert g.finished and not g.truncated
    assert g.policy_tokens == 9 and g.last_turn_ids == ids("ans$")
    # the environment read each turn's text without end-of-sequence, with the episode's own state
    assert env.seen == [(1, "call"), (1, "ans")]
    assert [c.contexts for c in engine.calls] == [["Q:"], ["Q:call$R1\n"]]
    assert values(ran.metrics)["episode/observation_tokens_mean"] == 3.0


# -- 2. batched turns ------------------------------------------------------------------------------------------


def test_turns_are_batched_over_live_episodes():
    env = ScriptedEnv({"call": obs("R"), "ans": Observation(done=True)})
    engine = ScriptedEngine(
        {
            "A:": ["ans$", "call$", "call$"],
            "B:": ["call$", "ans$", "call$"],
            "A:call$R\n": ["call$"],
            "B:call$R\n": ["ans$"],
            "A:call$R\ncall$R\n": ["ans$"],
        }
    )
    ran = run(EpisodeRunner(env, TOK, max_turns=4, max_tokens=100), engine, ["A:", "B:"], n=3, seed=7)
    first, second, third = engine.calls  # one call per turn, no more
    assert (first.contexts, first.n, first.seed) == (["A:", "B:"], 3, 7)  # turn 1: group_size for every prompt
    # later turns: n = 1 for each live episode only (A0 and B1 ended after turn 1, B0 and B2 after turn 2)
    assert (second.contexts, second.n) == (["A:call$R\n"] * 2 + ["B:call$R\n"] * 2, 1)
    assert (third.contexts, third.n) == (["A:call$R\ncall$R\n"] * 2, 1)
    seeds = [c.seed for c in engine.calls]
    assert len(set(seeds)) == 3 and None not in seeds
    # the groups keep the samples' order and each episode its place in its group
    turns = [[len(g.turns) for g in group] for group in ran.groups]
    assert turns == [[1, 3, 3], [2, 1, 2]]
    assert all(TOK.decode(g.last_turn_ids) == "ans" for group in ran.groups for g in group)
    assert [[g.prompt_ids for g in group] for group in ran.groups] == [[ids("A:")] * 3, [ids("B:")] * 3]
    assert values(ran.metrics)["episode/turns_mean"] == 2.0 and values(ran.metrics)["episode/truncated"] == 0.0


def test_the_single_turn_environment_is_the_one_call_rollout():
    engine = ScriptedEngine({"A:": ["a$", "b"], "B:": ["c$", "d$"]})
    runner = EpisodeRunner(default_registry().create("environment", "single-turn"), TOK, max_turns=1)
    ran = run(runner, engine, ["A:", "B:"], n=2)
    assert len(engine.calls) == 1 and ran.metrics == {}
    (a0, a1), _ = ran.groups
    assert a0.policy_mask is None and a0.turns is None and a0.response_ids == ids("a$")
    assert not a1.finished and not a1.truncated  # exactly what the engine returned
    assert runner.response_width(16) == 16


# -- 3. limits and metrics ------------------------------------------------------------------------------------


def test_limits_end_episodes_truncated_and_metrics_count_them():
    ok = ToolOutcome("calculator", "ok", "15")
    failed = [
        ToolOutcome("", "malformed", "Error: malformed tool call: x"),
        ToolOutcome("search", "unknown", "Error: unknown tool 'search'"),
        ToolOutcome("calculator", "timeout", "Error: calculator timed out after 2 s"),
        ToolOutcome("calculator", "error", "Error: calculator: division by zero"),
    ]
    env = ScriptedEnv(
        {
            "call": obs("R1", tool_outcomes=[ok]),
            "bad": obs("E", tool_outcomes=failed),
            "ans": Observation(done=True),
        }
    )
    engine = ScriptedEngine(
        {
            "Q:": ["call$"],
            "Q:call$R1\n": ["call$"],  # never stops calling: ended at max_turns
            "U:": ["cal"],  # no end-of-sequence: ended after its first turn
            "M:": ["bad$"],
            "M:bad$E\n": ["ans$"],  # ends by itself
        }
    )
    ran = run(EpisodeRunner(env, TOK, max_turns=2, max_tokens=100), engine, ["Q:", "U:", "M:"])
    (q,), (u,), (m,) = ran.groups
    assert pieces(q) == [("call$", 1), ("R1\n", 0), ("call$", 1)]  # no observation after the last allowed turn
    assert q.truncated and not q.finished and len(q.turns) == 2
    assert pieces(u) == [("cal", 1)] and u.truncated and not u.finished and u.turn_rewards == [0.0]
    assert m.finished and not m.truncated and len(m.turns) == 2
    assert all(text != "cal" for _, text in env.seen)  # an unfinished turn is not answered
    assert values(ran.metrics) == pytest.approx(
        {
            "episode/turns_mean": 5 / 3,
            "episode/truncated": 2 / 3,
            "episode/observation_tokens_mean": (3 + 2) / 3,
            "tool/calls": 6.0,  # the last turn of q was answered too (its call ran): 2 + 4
            "tool/calls_per_episode": 2.0,
            "tool/errors": 3.0,  # malformed + unknown + error
            "tool/timeouts": 1.0,
        }
    )  # per-tool counts only for the environment's own tools (this one has none)
    env.tools = {"calculator": None}
    ran = run(EpisodeRunner(env, TOK, max_turns=2, max_tokens=100), engine, ["Q:", "U:", "M:"])
    assert {k: v for k, v in values(ran.metrics).items() if k.count("/") == 2} == {
        "tool/calculator/calls": 4.0,
        "tool/calculator/errors": 1.0,
        "tool/calculator/timeouts": 1.0,
    }  # the made-up "search" has no keys of its own: it is an unknown call in tool/errors


@pytest.mark.parametrize(
    ("max_tokens", "expected", "call_limit"),
    [
        (12, [("call$", 1), ("R1\n", 0), ("ca", 1)], 2),  # the engine is asked for the room left: 2 tokens
        (10, [("call$", 1)], None),  # the observation would leave no room for a policy token: ended before it
        (5, [("cal", 1)], None),  # the first turn is cut where it passes the budget
    ],
)
def test_the_token_budget_cuts_an_episode(max_tokens, expected, call_limit):
    env = ScriptedEnv({"call": obs("R1", reward=0.25), "ans": Observation(done=True)})
    engine = ScriptedEngine({"Q:": ["call$"], "Q:call$R1\n": ["call$"]})
    ran = run(EpisodeRunner(env, TOK, max_turns=4, max_tokens=max_tokens), engine, ["Q:"])
    ((g,),) = ran.groups
    assert pieces(g) == expected and g.truncated and not g.finished
    assert len(g.prompt_ids) + len(g.response_ids) <= max_tokens
    assert len(g.response_logprobs) == len(g.response_ids) == len(g.policy_mask)
    if call_limit is not None:
        assert engine.calls[1].max_new_tokens == call_limit
    else:
        assert len(engine.calls) == 1
    assert values(ran.metrics)["episode/truncated"] == 1.0


def test_a_prompt_longer_than_the_budget_gets_no_response_tokens():
    env = ScriptedEnv({"call": obs("R1")})
    engine = ScriptedEngine({"LONGPROMPT:": ["call$"]})
    ran = run(EpisodeRunner(env, TOK, max_turns=3, max_tokens=8), engine, ["LONGPROMPT:"])
    ((g,),) = ran.groups
    assert g.response_ids == [] and g.policy_mask == [] and g.truncated and env.seen == []


# -- 4. the environment answers a turn's episodes concurrently ----------------------------------------------


class BarrierEnv(Environment):
    """Every step waits until ``parties`` steps are in progress at once (sequential steps break the barrier)."""

    name = "barrier"

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=10)
        self.threads: set[int] = set()

    def step(self, state, sample, text):
        self.barrier.wait()  # BrokenBarrierError unless the other episodes' steps run meanwhile
        self.threads.add(threading.get_ident())
        return Observation(done=True)


def test_the_environment_answers_a_turns_episodes_concurrently():
    env = BarrierEnv(parties=6)
    engine = ScriptedEngine(lambda text, i: f"t{i}$")
    ran = run(EpisodeRunner(env, TOK, max_turns=3, max_tokens=100), engine, ["A:", "B:", "C:"], n=2)
    assert len(env.threads) == 6 and not env.barrier.broken
    assert len(engine.calls) == 1 and all(g.finished for group in ran.groups for g in group)


# -- 5. the `tools` environment with the real calculator and hermes parser -------------------------------------


def _call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_the_tools_environment_runs_real_calls_and_never_crashes():
    registry = default_registry()
    env = registry.create("environment", "tools")
    env.use_tools({"calculator": registry.create("tool", "calculator")}, registry.create("tool_parser", "hermes"))
    first = {
        "good:": _call("calculator", expression="3*5") + EOS,
        "bad:": '<tool_call>{"name": calculator}</tool_call>' + EOS,
        "who:": _call("search", q="x") + EOS,
        "div:": _call("calculator", expression="1/0") + EOS,
    }

    def script(text, i):
        return "15$" if text.endswith("</tool_response>\n") else first[text]

    engine = ScriptedEngine(script)
    ran = run(EpisodeRunner(env, TOK, max_turns=3, max_tokens=400), engine, list(first), max_new_tokens=100)
    observations = {}
    for prompt, (g,) in zip(first, ran.groups, strict=True):
        (turn1, _), (observation, m), (turn2, _) = pieces(g)
        assert turn1 == first[prompt] and turn2 == "15$" and m == 0
        assert g.finished and not g.truncated  # the second turn called nothing: the episode ended itself
        observations[prompt] = observation
    assert observations["good:"] == "<tool_response>\n15\n</tool_response>\n"
    assert observations["bad:"].startswith(
        "<tool_response>\nError: malformed tool call: the body of <tool_call> is not valid JSON"
    )
    assert observations["bad:"].endswith("\n</tool_response>\n")
    assert (
        observations["who:"] == "<tool_response>\nError: unknown tool 'search'; available tools: calculator\n"
        "</tool_response>\n"
    )
    assert observations["div:"] == "<tool_response>\nError: calculator: division by zero\n</tool_response>\n"
    m = values(ran.metrics)
    assert (m["tool/calls"], m["tool/errors"], m["tool/timeouts"]) == (4.0, 3.0, 0.0)
    assert (m["tool/calculator/calls"], m["tool/calculator/errors"], m["tool/calculator/timeouts"]) == (2.0, 1.0, 0.0)
    assert "tool/search/calls" not in m
    assert m["episode/turns_mean"] == 2.0 and m["episode/truncated"] == 0.0


# -- 6. the loss of an episode equals the single-turn loss on the same policy tokens ---------------------------

# rows of an episode batch: 1 = a policy token, 0 = an observation's token, then padding to the width
LAYOUT = [
    [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1],
    [1, 0, 0, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1],
    [1, 1, 0, 1],
]
WIDTH = 14
ALGORITHMS = [
    {"preset": "grpo"},  # token ratio, seq-mean-token-mean, k3 KL 0.04
    {"preset": "gspo", "kl_coef": 0.1},  # sequence ratio
    {"preset": "gspo-token", "kl_coef": 0.1},
    {"preset": "dr-grpo", "kl_coef": 0.05},  # seq-mean-token-sum-norm: normalised by the mask's width
    {"preset": "dapo", "kl_coef": 0.02},  # token-mean
    {"aggregation": {"name": "seq-mean-token-sum"}, "kl": {"name": "k1"}, "kl_coef": 0.1},
    {"preset": "cispo"},
    {"preset": "gmpo"},
    {"preset": "sapo"},
]


def _episode_and_compact(garbage: float, seed: int = 0):
    """The same policy tokens' values as an episode batch (observation columns masked, holding ``garbage``) and as
    a compacted single-turn batch (policy columns only, padded with masked columns to the same width)."""
    g = torch.Generator().manual_seed(seed)
    rows = len(LAYOUT)
    mask = torch.zeros(rows, WIDTH)
    compact_mask = torch.zeros(rows, WIDTH)
    policy = torch.zeros(rows, WIDTH, dtype=torch.bool)
    for r, layout in enumerate(LAYOUT):
        mask[r, : len(layout)] = torch.tensor(layout, dtype=torch.float32)
        policy[r, : len(layout)] = torch.tensor(layout, dtype=torch.bool)
        compact_mask[r, : sum(layout)] = 1.0
    observation = torch.zeros_like(policy)
    for r, layout in enumerate(LAYOUT):
        observation[r, : len(layout)] = torch.tensor([m == 0 for m in layout])
    count = int(policy.sum())
    logp = -torch.rand(count, generator=g) * 3
    old = logp + (torch.rand(count, generator=g) - 0.5) * 0.8  # ratios both sides of the clip range
    adv = torch.randn(count, generator=g)
    ref = logp + (torch.rand(count, generator=g) - 0.5) * 0.6

    def spread(v, where):  # everything but the policy tokens (observations, padding) holds garbage
        out = torch.full((rows, WIDTH), garbage)
        out[where] = v
        return out

    compact_where = compact_mask > 0
    episode = [spread(v, policy) for v in (logp, old, adv, ref)]
    compact = [spread(v, compact_where) for v in (logp, old, adv, ref)]
    return (episode, mask, policy, observation), (compact, compact_mask, compact_where)


def _loss(objective, tensors, mask):
    logp, old, adv, ref = (t.clone() for t in tensors)
    logp.requires_grad_(True)
    loss, metrics = objective(logp, old, adv, mask, ref)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, metrics


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.get("preset") or a["aggregation"]["name"])
def test_an_episodes_loss_equals_the_single_turn_loss_on_its_policy_tokens(algorithm):
    objective = build_objective(algorithm)
    (episode, mask, policy, observation), (compact, compact_mask, where) = _episode_and_compact(garbage=37.0)
    loss, grad, metrics = _loss(objective, episode, mask)
    single, single_grad, single_metrics = _loss(objective, compact, compact_mask)
    assert torch.isfinite(loss) and float(loss) != 0.0
    assert float(loss) == pytest.approx(float(single), abs=1e-6)
    assert torch.allclose(grad[policy], single_grad[where], atol=1e-6)  # the same gradient at every policy token
    assert (grad[observation] == 0).all()
    for key in ("kl/ref", "clip/fraction", "ratio/mean", "loss/policy"):
        if key in metrics:
            assert metrics[key] == pytest.approx(single_metrics[key], abs=1e-6), key
    # whatever the observation columns hold changes nothing
    for garbage in (-1e4, float("inf"), float("nan")):
        (other, *_), _ = _episode_and_compact(garbage=garbage)
        again, again_grad, _ = _loss(objective, other, mask)
        assert float(again) == pytest.approx(float(loss), abs=1e-6), garbage
        assert torch.allclose(again_grad, grad, atol=1e-6), garbage


def test_the_training_engine_scores_policy_tokens_of_an_episode_as_one_sequence(tmp_path):
    from rlzoo.engines.torch_trainer import TorchTrainingEngine
    from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model

    tokenizer = build_char_tokenizer("0123456789+*=<>/_abcdefghijklmnopqrstuvwxyz")
    tiny = TinyModelConfig(architecture="qwen3", hidden_size=32, intermediate_size=64)
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, tmp_path / "m")
    engine = TorchTrainingEngine()
    engine.start(EngineContext(tmp_path / "m", pad_token_id=0, eos_token_id=1), TrainerConfig(lr=1e-2))
    eos = [tokenizer.eos_token_id]
    enc = lambda text: ids(text, tokenizer)  # noqa: E731
    prompts = [enc("12*34="), enc("5+6=")]
    turns = [
        [(enc("<call>12*34</call>") + eos, 1), (enc("<r>408</r>"), 0), (enc("408") + eos, 1)],
        [(enc("11") + eos, 1)],
    ]
    responses = [[t for part, _ in row for t in part] for row in turns]
    masks = [[m for part, m in row for _ in part] for row in turns]
    width = 40
    episode = make_token_batch(prompts, responses, 0, response_width=width, policy_masks=masks)
    single = make_token_batch(prompts, responses, 0, response_width=width)
    assert torch.equal(episode.input_ids, single.input_ids)  # the observation is in the context either way
    logp, full = engine.logprobs(episode), engine.logprobs(single)
    on = episode.response_mask > 0
    observation = (single.response_mask > 0) & ~on
    assert observation.sum() == len(enc("<r>408</r>"))
    assert (logp[observation] == 0).all() and (logp[on] < 0).all()
    assert torch.allclose(logp[on], full[on], atol=1e-6)
    seen = {}

    def loss_fn(values):
        seen["logp"] = values.detach()
        return values.sum() * 0.0, {}

    engine.train_step(episode, loss_fn)  # the training pass sees the same log-probs
    assert torch.allclose(seen["logp"], logp, atol=1e-6)


# -- 7. process advantages over turns ------------------------------------------------------------------------


class LastTurnIs(Verifier):
    name = "last-turn-is"

    def verify(self, sample, response):
        return Verdict(float(response == "ans"))


def _turn_reward_components(max_new_tokens: int, shapers=()):
    registry = default_registry()
    env = ScriptedEnv(
        {"call": obs("R1", reward=0.25), "ans": Observation(done=True, reward=0.5), "no": Observation(done=True)},
        gives_turn_rewards=True,
    )
    engine = ScriptedEngine({"Q:": ["call$", "no$"], "Q:call$R1\n": ["ans$"]})
    config = RunConfig.model_validate(
        {
            "rollout": {"prompts_per_step": 1, "group_size": 2, "max_new_tokens": max_new_tokens},
            "episode": {"max_turns": 3},
        }  # as the runner's (the scripted environment is not a registered one)
    )
    parts = Components(
        objective=None,
        advantage=registry.create("advantage", "process", {"std_normalize": False}),
        verifier=LastTurnIs(),
        correction=None,
        rollout=engine,
        learner=Learner(None),
        tokenizer=TOK,
        shapers=[
            registry.create("reward_shaper", s["name"], {k: v for k, v in s.items() if k != "name"}) for s in shapers
        ],
        episodes=EpisodeRunner(env, TOK, max_turns=3, max_tokens=40),
    )  # type: ignore[arg-type]
    return config, parts


def test_turn_rewards_give_one_process_step_per_turn():
    config, parts = _turn_reward_components(16, shapers=[{"name": "length", "coef": 0.1}])
    samples = [Sample("Q:", "x")]
    groups, _ = generate_and_score(samples, generation_seed(config.seed, 0, 0), parts.rollout_parts(config), Timer())
    rewards, ends = turn_steps(groups)
    # episode 0: call (0.25), ans (0.5) + verifier 1 + shaping -0.1 * 9 policy tokens; episode 1: no (0) + 0 - 0.3
    assert rewards == [pytest.approx([0.25, 0.5 + 1.0 - 0.9]), pytest.approx([-0.3])]
    assert ends == [[5, 9], [3]]  # cumulative policy tokens: the observation's 3 tokens are not counted
    assert groups[0].rewards.tolist() == pytest.approx([1.75, 0.0])  # the verifier's plus the turn rewards

    rollout = collect(0, samples, parts.rollout_parts(config), Timer())
    steps = torch.tensor([0.25, 0.6, -0.3], dtype=torch.float64)
    r = (steps - steps.mean()).tolist()  # every step of the group normalised together (std_normalize false)
    expected = torch.zeros(2, 40)
    expected[0, :5] = r[0] + r[1]  # turn 1: the suffix sum of its step and the later ones
    expected[0, 8:12] = r[1]  # turn 2 (after the masked observation at 5..7)
    expected[1, :3] = r[2]
    assert rollout.batch.response_mask[0, 5:8].tolist() == [0.0] * 3
    assert torch.allclose(parts.advantage.compute(rollout.rewards).double(), expected.double(), atol=1e-6)
    # the same steps per token (gae's token rewards): each turn's reward at its last policy token, the observation
    # columns 5..7 skipped; the verifier's reward and shaping at the episode's last policy token
    token_rewards = torch.zeros(2, 40)
    token_rewards[0, 4], token_rewards[0, 11], token_rewards[1, 2] = 0.25, 0.6, -0.3
    assert torch.allclose(rollout.rewards.token_rewards, token_rewards, atol=1e-6)


def test_reward_shaping_of_an_episode_longer_than_one_turns_budget():
    """An episode's policy tokens may pass rollout.max_new_tokens (a budget per turn): shapers measure them against
    the episode's budget, max_new_tokens x max_turns, and do not fail."""
    config, parts = _turn_reward_components(6, shapers=[{"name": "length", "coef": 0.1}])
    rollout = collect(0, [Sample("Q:", "x")], parts.rollout_parts(config), Timer())
    assert rollout.rewards.rewards.tolist() == pytest.approx([1.75 - 0.9, -0.3])


# -- 8. chat mode ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_tok():
    from rlzoo.models.chat import build_chat_tokenizer

    texts = ["What is 3*5?", _call("calculator", expression="3*5"), "<tool_response>\n15\n</tool_response>"]
    return build_chat_tokenizer(texts * 4, vocab_size=320)


OBSERVATION = "\n<|im_start|>user\n<tool_response>\n15\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_chat_observations_are_what_the_template_writes_between_turns(chat_tok):
    history = [{"role": "user", "content": "What is 3*5?"}]
    tool = [{"role": "tool", "name": "calculator", "content": "15"}]
    turn = _call("calculator", expression="3*5")
    text = chat_observation_text(chat_tok, history, turn, tool, PromptConfig(plain="chat"))
    assert text == OBSERVATION
    no_think = PromptConfig(plain="chat", chat_template_kwargs={"enable_thinking": False})
    assert chat_observation_text(chat_tok, history, "x", tool, no_think) == OBSERVATION + "<think>\n\n</think>\n\n"


def test_a_chat_episode_appends_exactly_the_templates_observation(chat_tok):
    registry = default_registry()
    config = build_config(
        {
            "prompt": {"plain": "chat"},
            "episode": {"environment": {"name": "tools"}, "tools": [{"name": "calculator"}], "max_turns": 3},
        },
        registry=registry,
    )
    described = with_tool_descriptions(config, create_tools(config, registry))
    assert "tools" not in config.prompt.chat_template_kwargs  # a copy, the config is left as it is
    schema = described.prompt.chat_template_kwargs["tools"]
    assert schema == [registry.create("tool", "calculator").schema()]
    runner = build_episode_runner(described, registry, chat_tok, context=512)
    sample = Sample("What is 3*5?", "15")
    prompt = prompt_ids(chat_tok, sample, described.prompt)
    rendered = chat_tok.decode(prompt, skip_special_tokens=False)
    assert "# Tools" in rendered and '"name": "calculator"' in rendered and "Evaluate an arithmetic" in rendered
    call = _call("calculator", expression="3*5")

    def script(text, i):
        return "15<|im_end|>" if text.endswith(OBSERVATION) else call + "<|im_end|>"

    engine = ScriptedEngine(script, chat_tok)
    ran = runner.run(engine, [sample], SamplingSettings(n=1, max_new_tokens=64, seed=0), described.prompt)
    ((g,),) = ran.groups
    turn1 = ids(call, chat_tok) + [chat_tok.eos_token_id]
    observation = ids(OBSERVATION, chat_tok)
    turn2 = ids("15", chat_tok) + [chat_tok.eos_token_id]
    assert g.prompt_ids == prompt
    assert g.response_ids == turn1 + observation + turn2
    assert g.policy_mask == [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
    assert engine.calls[1].contexts == [chat_tok.decode(prompt + turn1 + observation, skip_special_tokens=False)]
    assert g.finished and not g.truncated
    # the episode reads as the template renders the whole conversation
    conversation = [
        {"role": "user", "content": "What is 3*5?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "name": "calculator", "content": "15"},
        {"role": "assistant", "content": "15"},
    ]
    whole = chat_tok.apply_chat_template(conversation, tokenize=False, tools=schema)
    assert chat_tok.decode(g.prompt_ids + g.response_ids, skip_special_tokens=False) + "\n" == whole


def test_tool_descriptions_leave_a_config_without_tools_alone():
    config = build_config({})
    assert with_tool_descriptions(config, create_tools(config, default_registry())) is config


# -- 9. cold-start demonstrations -----------------------------------------------------------------------------


def test_demonstrations_replay_through_the_real_tools():
    from rlzoo.models import build_char_tokenizer
    from rlzoo.runtime.cold_start import demonstrations

    registry = default_registry()
    config = build_config(
        {
            "task": {"name": "calculator-arithmetic"},
            "cold_start": {"examples": 16},
            "episode": {"environment": {"name": "tools"}, "tools": [{"name": "calculator"}], "max_turns": 2},
        },
        registry=registry,
    )
    task = registry.create("task", "calculator-arithmetic", config.task.params)
    tokenizer = build_char_tokenizer(task.alphabet())
    runner = build_episode_runner(config, registry, tokenizer, context=256)
    samples = task.samples("train", 16, 0)
    calling = [s for s in samples if len(s.demonstration_turns) == 2]
    direct = [s for s in samples if len(s.demonstration_turns) == 1]
    assert calling and direct
    enc = lambda text: ids(text, tokenizer)  # noqa: E731
    eos = [tokenizer.eos_token_id]
    for sample in calling:
        a, b = sample.prompt.rstrip("=").split("*")
        result = str(int(a) * int(b))
        assert result == sample.answer
        prompt, response, mask = runner.demonstration(sample, config.prompt)
        call = enc('<tool_call>{"name":"calculator","arguments":{"expression":"' + f"{a}*{b}" + '"}}</tool_call>')
        observation = enc(f"<tool_response>\n{result}\n</tool_response>\n")
        assert prompt == enc(sample.prompt)
        assert response == call + eos + observation + enc(sample.answer) + eos
        assert mask == [1] * (len(call) + 1) + [0] * len(observation) + [1] * (len(sample.answer) + 1)
    for sample in direct:
        prompt, response, mask = runner.demonstration(sample, config.prompt)
        assert response == enc(sample.answer) + eos and mask == [1] * len(response)  # no observation
    # the cold start trains on exactly these
    examples = demonstrations(config, task, tokenizer, registry)
    assert len(examples) == 16 and all(m is not None and len(m) == len(r) for _, r, m in examples)
    assert any(0 in m for _, _, m in examples) and any(0 not in m for _, _, m in examples)


# -- 10. config errors -------------------------------------------------------------------------------------------

TOOLS = {"environment": {"name": "tools"}, "tools": [{"name": "calculator"}], "max_turns": 2}


def _problems(data: dict, tmp_path) -> list[tuple[str, str]]:
    registry = default_registry()
    with pytest.raises(ConfigError) as err:
        config = build_config({"output_dir": str(tmp_path / "run"), **data}, registry=registry)
        preflight(config, registry)
    return err.value.problems


@pytest.mark.parametrize(
    ("episode", "field", "message"),
    [
        ({**TOOLS, "tools": [{"name": "calculater"}]}, "episode.tools.0.name", "did you mean 'calculator'"),
        ({"max_turns": 0}, "episode.max_turns", "greater than or equal to 1"),
        ({**TOOLS, "max_tokens": 100_000}, "episode.max_tokens", "exceeds the 256-token context"),
        ({"tools": [{"name": "calculator"}]}, "episode.tools", "environment 'single-turn' calls no tools"),
        ({"environment": {"name": "tools"}, "max_turns": 2}, "episode.tools", "calls tools: name at least one"),
        ({"max_turns": 3}, "episode.max_turns", "ends every episode after one turn"),
        ({**TOOLS, "max_turns": 1}, "episode.max_turns", "before a tool's result is read; use at least 2"),
        ({**TOOLS, "max_tokens": 20}, "episode.max_tokens", "no room for a response after a prompt of up to"),
    ],
)
def test_episode_config_errors_name_the_field(episode, field, message, tmp_path):
    problems = _problems({"episode": episode, "prompt": {"max_prompt_tokens": 20}}, tmp_path)
    assert any(loc == field and message in text for loc, text in problems), problems


def test_a_good_episode_config_passes(tmp_path):
    registry = default_registry()
    # a task whose character tokenizer can write the calls (arithmetic's cannot: tool_markup_rule refuses it)
    data = {
        "output_dir": str(tmp_path / "run"),
        "task": {"name": "calculator-arithmetic"},
        "episode": {**TOOLS, "max_tokens": 200},
    }
    config = build_config(data, registry=registry)
    preflight(config, registry)
    assert config.episode.tool_parser.name == "hermes"  # the default parser when tools are given


def test_tools_in_chat_prompts_need_a_template_that_reads_them(tmp_path, chat_tok):
    from rlzoo.models import build_tiny_model, save_model
    from rlzoo.models.chat import build_chat_tokenizer

    plain = build_chat_tokenizer(["What is 3*5?"] * 4, vocab_size=320)
    plain.chat_template = (
        "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    without = save_model(build_tiny_model(TinyModelConfig(), plain), plain, tmp_path / "without")
    with_tools = save_model(build_tiny_model(TinyModelConfig(), chat_tok), chat_tok, tmp_path / "with")
    base = {"prompt": {"plain": "chat"}, "cold_start": {"enabled": False}, "episode": TOOLS}
    problems = _problems({**base, "model": {"path": str(without)}}, tmp_path)
    assert [loc for loc, _ in problems] == ["episode.tools"], problems
    assert "never reads `tools`" in problems[0][1]
    registry = default_registry()
    preflight(
        build_config(
            {**base, "output_dir": str(tmp_path / "ok"), "model": {"path": str(with_tools)}}, registry=registry
        ),
        registry,
    )  # accepted: its template renders tools
    plain_text = {
        **base,
        "prompt": {"plain": "text"},
        "output_dir": str(tmp_path / "text"),
        "model": {"path": str(without)},
    }
    preflight(build_config(plain_text, registry=registry), registry)  # plain-text prompts do not need it


@pytest.mark.parametrize(
    ("episode", "field", "message"),
    [
        (
            "{environment: {name: tools}, tools: [{name: calculater}], max_turns: 2}",
            "episode.tools.0.name",
            "did you mean 'calculator'",
        ),
        ("{max_turns: 3}", "episode.max_turns", "ends every episode after one turn"),
    ],
)
def test_rlzoo_config_check_reports_episode_errors(episode, field, message, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(f"output_dir: {tmp_path / 'run'}\nepisode: {episode}\n")
    proc = subprocess.run(
        [*_rlzoo_command(), "config", "check", str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert field in proc.stderr and message in proc.stderr, proc.stderr
