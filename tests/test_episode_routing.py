"""Routing across the turns of a multi-turn episode (R3) with the hf rollout engine.

An episode's turns come from separate engine calls: turn 1 from one call with ``n = group_size``, every later turn
from a call with ``n = 1`` on the episode's whole token sequence so far. Each call's ``Generation.routing`` covers
the sequence from position 0; :func:`rlzoo.moe.stitch_routing` keeps, at every position, the experts of the
call that ran it first: turn k's own call for the rows that predict its policy tokens, and its prefill for the
previous turn's last token and the observation's tokens. A later call re-routes the earlier positions too; those
rows must never overwrite the earlier turns' (the known failure: routing overwritten per turn).

Checked here on a tiny Qwen3-MoE on CPU, fp32: the stitched routing's shape; every turn's rows against that turn's
own call (also when the rollout's routers move between calls, so that an overwrite would be visible); a synthetic
stitch in which every call writes its own number; and replay in the torch training engine, which reproduces the
rollout's experts at every policy token's predicting position and the rollout's log-probs.

tests/test_vllm_episode_routing.py runs the same checks on the vLLM rollout engine with the helpers of this module
(the environment, the model's sizes, the turn recorder, ``run_episodes``, the ``check_*`` functions, the router
nudge, the replay).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from rlzoo.config.schema import PromptConfig, TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext, Generation, RolloutEngine, SamplingSettings
from rlzoo.engines.hf_rollout import HFRolloutEngine
from rlzoo.engines.tokens import make_token_batch
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.episodes.runner import EpisodeRunner
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Environment, Observation, Sample
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.moe import find_routers, routing_for_batch, stitch_routing

ALPHABET = "0123456789+-= "
OBSERVATION = " +1="  # the environment's answer to every turn (4 tokens)
PROMPTS = ["12+34=", "7+8=", "5-3=", "100-1="]
GROUP = 4
MAX_TURNS = 3
MAX_NEW = 10
MAX_TOKENS = 96  # room for every turn uncut: 6 + 3 x 10 + 2 x 4 tokens at most
SEED = 0
LOGP_TOL = 1e-4  # |replayed training log-prob - rollout log-prob| per policy token, fp32 (as tests/test_moe_routing.py)
MODEL = TinyModelConfig(  # a tiny Qwen3-MoE; head_dim 32 is one of vLLM's head sizes
    architecture="qwen3_moe",
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    intermediate_size=128,
    moe_intermediate_size=64,
    num_experts=8,
    num_experts_per_tok=2,
)


class ScriptedEnvironment(Environment):
    """Answers the first two turns with :data:`OBSERVATION`; the episode ends after its third turn."""

    name = "scripted-observation"

    def reset(self, sample: Sample) -> dict[str, int]:
        return {"turns": 0}

    def step(self, state: dict[str, int], sample: Sample, text: str) -> Observation:
        state["turns"] += 1
        return Observation(messages=[{"role": "user", "content": OBSERVATION}], done=state["turns"] >= MAX_TURNS)

    def plain_text(self, messages) -> str:
        return "".join(m["content"] for m in messages)  # no newline: the char tokenizer has none


class TurnRecorder(RolloutEngine):
    """Forwards ``generate`` to ``engine`` and keeps every call's prompts and generations (with their routing);
    ``after_call`` runs after each call (e.g. to move the rollout's routers between turns)."""

    name = "turn-recorder"

    def __init__(self, engine: RolloutEngine, after_call=None) -> None:
        super().__init__()
        self.engine, self.after_call = engine, after_call
        self.calls: list[tuple[list[list[int]], list[list[Generation]]]] = []

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Generation]]:
        groups = self.engine.generate(prompts, sampling)
        self.calls.append(([list(p) for p in prompts], groups))
        if self.after_call is not None:
            self.after_call()
        return groups


@dataclass
class TurnSpan:
    """Turn k's rows of the episode's routing, ``[lo, hi)``: for k > 1 the previous turn's last token and the
    observation's tokens (prefilled by turn k's call), then the rows predicting turn k's tokens; and ``call``, the
    generation turn k's own engine call returned (its routing from position 0)."""

    lo: int
    hi: int
    call: Generation


def turn_spans(episodes: list[Generation], calls) -> list[list[TurnSpan]]:
    """Each episode's turns matched with the engine calls that sampled them. Call ``k`` (0-based) samples turn
    ``k + 1`` of the episodes that have one, in the runner's order; its prompts are checked to be their tokens."""
    assert len(calls) == max(len(e.turns) for e in episodes)
    first = [g for group in calls[0][1] for g in group]
    assert len(first) == len(episodes)
    spans = []
    for index, episode in enumerate(episodes):
        p, mine = len(episode.prompt_ids), []
        for k, (start, end) in enumerate(episode.turns):
            if k == 0:
                call, lo = first[index], 0
            else:
                live = [i for i, e in enumerate(episodes) if len(e.turns) > k]
                prompts, groups = calls[k]
                assert len(prompts) == len(live)
                row = live.index(index)
                call = groups[row][0]
                context = episode.prompt_ids + episode.response_ids[:start]
                assert prompts[row] == call.prompt_ids == context
                lo = p + episode.turns[k - 1][1] - 1  # the previous turn's last token: first run by this call
            assert call.response_ids == episode.response_ids[start:end]  # no turn was cut
            assert call.routing is not None and call.routing.shape[0] == p + end - 1
            mine.append(TurnSpan(lo, p + end - 1, call))
        spans.append(mine)
    return spans


def run_episodes(engine: RolloutEngine, tokenizer, after_call=None) -> tuple[list[Generation], TurnRecorder]:
    recorder = TurnRecorder(engine, after_call)
    runner = EpisodeRunner(ScriptedEnvironment(), tokenizer, max_turns=MAX_TURNS, max_tokens=MAX_TOKENS)
    samples = [Sample(p, "") for p in PROMPTS]
    sampling = SamplingSettings(n=GROUP, max_new_tokens=MAX_NEW, seed=SEED)
    batch = runner.run(recorder, samples, sampling, PromptConfig())
    episodes = [g for group in batch.groups for g in group]
    assert [len(g) for g in batch.groups] == [GROUP] * len(PROMPTS)
    return episodes, recorder


def check_episodes_have_several_turns(episodes: list[Generation], recorder: TurnRecorder) -> None:
    turns = [len(e.turns) for e in episodes]
    assert max(turns) == MAX_TURNS and sum(t > 1 for t in turns) >= 3, turns
    assert len(recorder.calls) == MAX_TURNS
    assert all(g.routing is not None for _, groups in recorder.calls for group in groups for g in group)


def check_turns_keep_their_own_calls(episodes: list[Generation], recorder: TurnRecorder) -> int:
    """(a) and (b); returns how many turns after the first were checked."""
    later_turns = 0
    for episode, spans in zip(episodes, turn_spans(episodes, recorder.calls), strict=True):
        p, routing = len(episode.prompt_ids), episode.routing
        # (a) one row per position the model ran: prompt + response - 1 (the last token never runs)
        assert routing is not None and routing.shape[0] == p + len(episode.response_ids) - 1
        assert routing.shape[1:] == spans[0].call.routing.shape[1:]
        # the turns' spans tile the rows: every row comes from exactly one call
        assert spans[0].lo == 0 and spans[-1].hi == routing.shape[0]
        assert all(a.hi == b.lo for a, b in zip(spans, spans[1:]))
        for k, span in enumerate(spans):
            start, end = episode.turns[k]
            # (b) rows predicting turn k's policy tokens: the last prefilled row, then turn k's decode inputs
            predicting = slice(p + start - 1, p + end - 1)
            assert torch.equal(routing[predicting], span.call.routing[predicting]), (k, episode.turns)
            if k > 0:
                # the previous turn's last token and the observation: turn k's prefill ran them first
                # (the observation's last row predicts turn k's first token: counted in `predicting` above)
                observed = slice(span.lo, p + start - 1)
                assert p + start - 1 - span.lo == len(OBSERVATION)  # one character, one token
                assert torch.equal(routing[observed], span.call.routing[observed]), (k, episode.turns)
                assert all(m == 0 for m in episode.policy_mask[episode.turns[k - 1][1] : start])
                later_turns += 1
            assert torch.equal(routing[span.lo : span.hi], span.call.routing[span.lo : span.hi])
    return later_turns


@torch.no_grad()
def nudge_routers(model, generator: torch.Generator) -> None:
    """Moves every router's weights a little (noise from ``generator``), so that some positions route differently."""
    for router in find_routers(model):
        weight = router.module.weight
        weight.add_(0.1 * torch.randn(weight.shape, generator=generator).to(weight))


def check_routers_moved_between_turns(episodes: list[Generation], recorder: TurnRecorder) -> None:
    """For episodes run with the routers moved after every call: each turn still keeps its own call's routing, and
    the last call's routing (what an overwrite per turn would keep) differs from the stitched one somewhere."""
    assert check_turns_keep_their_own_calls(episodes, recorder) >= 3
    overwritten = 0
    for episode, spans in zip(episodes, turn_spans(episodes, recorder.calls), strict=True):
        if len(spans) > 1:
            last = spans[-1].call.routing
            earlier = slice(0, spans[-1].lo)
            overwritten += int((episode.routing[earlier] != last[earlier]).any(dim=(-1, -2)).sum())
    assert overwritten > 0, "the moved routers should re-route some earlier position differently"


# -- the hf rollout engine ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    tokenizer = build_char_tokenizer(ALPHABET)
    model = build_tiny_model(MODEL, tokenizer, seed=0)
    directory = save_model(model, tokenizer, tmp_path_factory.mktemp("episode_r3"))
    context = EngineContext(directory, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    engine = HFRolloutEngine(HFRolloutEngine.Params(record_routing=True))
    engine.start(context)
    episodes, recorder = run_episodes(engine, tokenizer)
    return tokenizer, context, engine, episodes, recorder


def test_episodes_have_several_turns(case):
    _, _, _, episodes, recorder = case
    check_episodes_have_several_turns(episodes, recorder)


def test_each_turn_keeps_the_routing_of_its_own_engine_call(case):
    _, _, _, episodes, recorder = case
    assert check_turns_keep_their_own_calls(episodes, recorder) >= 3


def test_stitching_survives_routers_that_move_between_turns(case):
    """The rollout's routers move after every call, so a later call's prefill re-routes the earlier turns'
    positions differently: the stitched routing still holds each turn's own experts, and the last call's routing
    (what an overwrite per turn would keep) differs from it."""
    tokenizer, context, _, _, _ = case
    engine = HFRolloutEngine(HFRolloutEngine.Params(record_routing=True))
    engine.start(context)
    generator = torch.Generator().manual_seed(1)
    episodes, recorder = run_episodes(engine, tokenizer, after_call=lambda: nudge_routers(engine.model, generator))
    check_routers_moved_between_turns(episodes, recorder)


# -- stitch_routing on synthetic routings --------------------------------------------------------------------------


def test_stitch_routing_keeps_the_first_call_of_every_position():
    """Call k writes k at every position it covers (its prefill re-routes all earlier positions with k too): the
    stitched routing holds, per position, the number of the call that ran it first."""
    prompt, turns, observations = 3, [4, 3, 2], [2, 1]
    stitched, length, expected = None, prompt, []
    for k, turn in enumerate(turns, start=1):
        routing = torch.full((length + turn - 1, 2, 2), k, dtype=torch.uint8)
        stitched = stitch_routing(stitched, routing, length + turn - 1)
        expected += [k] * (length + turn - 1 - len(expected))
        length += turn + (observations[k - 1] if k <= len(observations) else 0)
    assert stitched.shape == (prompt + sum(turns) + sum(observations) - 1, 2, 2)
    assert stitched[:, 0, 0].tolist() == expected
    assert expected == [1] * 6 + [2] * 5 + [3] * 3  # turn 1: prompt + 3 decodes; turn 2 from turn 1's last token
    assert torch.equal(stitched, torch.tensor(expected, dtype=torch.uint8)[:, None, None].expand(-1, 2, 2))
    # a call that does not cover the episode's positions is an error, not a short routing
    with pytest.raises(RlzooError, match="covers 4 positions"):
        stitch_routing(stitched, torch.zeros((4, 2, 2), dtype=torch.uint8), 5)


class NumberedEngine(RolloutEngine):
    """A scripted rollout engine: every response is ``RESPONSE`` (ending with end-of-sequence); call ``k`` (from 1)
    writes ``k`` into every row of its routing, prompt rows included."""

    name = "numbered"
    RESPONSE = [5, 6, 7, 1]

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Generation]]:
        self.count += 1
        out = []
        for prompt in prompts:
            group = []
            for _ in range(sampling.n):
                routing = torch.full((len(prompt) + len(self.RESPONSE) - 1, 2, 2), self.count, dtype=torch.uint8)
                group.append(Generation(list(prompt), list(self.RESPONSE), [-0.5] * len(self.RESPONSE), True, routing))
            out.append(group)
        return out


def test_episode_routing_is_not_overwritten_per_turn():
    """Through the runner: with every call re-routing the earlier positions differently, each row keeps the
    number of the call that ran it first (an overwrite per turn would leave the last call's number everywhere)."""
    tokenizer = build_char_tokenizer(ALPHABET)
    runner = EpisodeRunner(ScriptedEnvironment(), tokenizer, max_turns=MAX_TURNS, max_tokens=MAX_TOKENS)
    sampling = SamplingSettings(n=2, max_new_tokens=8)
    batch = runner.run(NumberedEngine(), [Sample("12+34=", "")], sampling, PromptConfig())
    obs = len(tokenizer(OBSERVATION, add_special_tokens=False)["input_ids"])
    turn = len(NumberedEngine.RESPONSE)
    for episode in batch.groups[0]:
        assert episode.turns == [(0, turn), (turn + obs, 2 * turn + obs), (2 * turn + 2 * obs, 3 * turn + 2 * obs)]
        rows = episode.routing[:, 0, 0].tolist()
        assert len(rows) == 6 + 3 * turn + 2 * obs - 1
        # turn 1: prompt + 3 decode inputs; turn 2: turn 1's EOS + observation + 3 decode inputs; turn 3 the same
        assert rows == [1] * (6 + turn - 1) + [2] * (1 + obs + turn - 1) + [3] * (1 + obs + turn - 1)
        assert (episode.routing == episode.routing[:, :1, :1]).all()


# -- replay in the training engine ---------------------------------------------------------------------------------


def replay_episodes(context: EngineContext, tokenizer, episodes: list[Generation]) -> tuple[float, float]:
    """(d): the stitched routings replayed in the torch training engine's forward. Returns the max |logp| gap
    between the training log-probs and the rollout's over every policy token, with replay and routed afresh."""
    trainer = TorchTrainingEngine()
    trainer.start(context, TrainerConfig())
    batch = make_token_batch(
        [e.prompt_ids for e in episodes],
        [e.response_ids for e in episodes],
        tokenizer.pad_token_id,
        policy_masks=[e.policy_mask for e in episodes],
    )
    layout = trainer.moe_layout()
    replay = routing_for_batch(
        [e.routing for e in episodes], batch, layers=layout.layers, num_experts=layout.num_experts
    )
    with trainer.routing_pass(replay=replay) as replayed:
        logp = trainer.logprobs(batch)
    with trainer.routing_pass():
        fresh_logp = trainer.logprobs(batch)
    used = replayed.routing
    assert used.shape == replay.shape
    gap = fresh_gap = 0.0
    policy_tokens = 0
    for row, episode in enumerate(episodes):
        p = len(episode.prompt_ids)
        # every row the rollout ran: replayed exactly (observations and the previous turns' last tokens included)
        n = p + len(episode.response_ids) - 1
        assert torch.equal(used.indices[row, :n].long(), episode.routing.long())
        for t, (mask, rollout) in enumerate(zip(episode.policy_mask, episode.response_logprobs, strict=True)):
            if not mask:
                assert batch.response_mask[row, t] == 0 and logp[row, t] == 0
                continue
            policy_tokens += 1
            position = p + t - 1  # the position whose output predicts policy token t
            assert torch.equal(used.indices[row, position], episode.routing[position].to(used.indices.dtype))
            gap = max(gap, abs(float(logp[row, t]) - rollout))
            fresh_gap = max(fresh_gap, abs(float(fresh_logp[row, t]) - rollout))
    assert policy_tokens == sum(sum(e.policy_mask) for e in episodes)
    return gap, fresh_gap


def test_replayed_stitched_routing_reproduces_the_rollout(case):
    tokenizer, context, _, episodes, _ = case
    gap, fresh_gap = replay_episodes(context, tokenizer, episodes)
    print(f"\n[hf episode R3] max |logp train - rollout| over policy tokens: replayed {gap:.2e}, fresh {fresh_gap:.2e}")
    assert gap < LOGP_TOL
