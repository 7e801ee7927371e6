"""rlzoo.episodes.prompts: chat templates, system prompt, template options, overlong prompts; one encoding everywhere.

The tokenizer is a byte-level BPE with a Qwen3-style chat template built locally (rlzoo.models.chat): no package
this project installs ships Qwen's own tokenizer files with its template.
"""

from __future__ import annotations

import logging

import pytest
import torch

from rlzoo.config.resolution import build_config
from rlzoo.config.schema import PromptConfig
from rlzoo.engines import Generation, RolloutEngine
from rlzoo.episodes.prompts import fit_prompts, prompt_ids
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.interfaces import Sample
from rlzoo.models import build_char_tokenizer
from rlzoo.models.chat import build_chat_tokenizer
from rlzoo.registry import default_registry
from rlzoo.rl import loop, rollouts
from rlzoo.util.timer import Timer

QUESTION = "What is 12 + 30? Put the answer in \\boxed{}."


@pytest.fixture(scope="module")
def tok():
    return build_chat_tokenizer([QUESTION, "You are a careful solver.", "\\boxed{42}"] * 4, vocab_size=320)


def chat(content: str = QUESTION, **kw) -> Sample:
    return Sample(prompt=content, answer="42", messages=[{"role": "user", "content": content}], **kw)


def text(tok, ids) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_plain_prompts_are_encoded_as_they_are(tok):
    s = Sample(prompt=QUESTION, answer="42")
    assert prompt_ids(tok, s, PromptConfig()) == tok(QUESTION, add_special_tokens=False)["input_ids"]
    wrapped = text(tok, prompt_ids(tok, s, PromptConfig(plain="chat")))
    assert wrapped == f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"


def test_messages_use_the_chat_template_with_generation_prompt(tok):
    ids = prompt_ids(tok, chat(), PromptConfig())
    assert text(tok, ids) == f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")  # special tokens are single ids, not pieces
    no_think = text(tok, prompt_ids(tok, chat(), PromptConfig(chat_template_kwargs={"enable_thinking": False})))
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_system_prompt_is_added_once(tok):
    config = PromptConfig(system="You are a careful solver.")
    rendered = text(tok, prompt_ids(tok, chat(), config))
    assert rendered.startswith("<|im_start|>system\nYou are a careful solver.<|im_end|>\n<|im_start|>user\n")
    own = Sample(
        QUESTION, "42", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    )
    rendered = text(tok, prompt_ids(tok, own, config))
    assert rendered.count("<|im_start|>system") == 1 and "Be brief." in rendered


def test_messages_without_a_chat_template_are_an_error():
    char = build_char_tokenizer("abc")
    with pytest.raises(RlzooError, match="need a tokenizer with a chat template"):
        prompt_ids(char, chat("abc"), PromptConfig())


def test_overlong_prompts_are_dropped_with_a_count(tok, caplog):
    short, long = chat("1+1?"), chat(QUESTION * 6)
    limit = len(prompt_ids(tok, short, PromptConfig())) + 2
    config = PromptConfig(max_prompt_tokens=limit)
    with caplog.at_level(logging.WARNING, logger="rlzoo.episodes.prompts"):
        kept = fit_prompts([short, long, short], tok, config, "train")
    assert kept == [short, short]
    assert "train split: 1 of 3 prompts are longer than prompt.max_prompt_tokens" in caplog.text
    with pytest.raises(RlzooError, match="was not dropped"):
        prompt_ids(tok, long, config)
    with pytest.raises(RlzooError, match="every prompt of the eval split"):
        fit_prompts([long], tok, config, "eval")


def test_overlong_prompts_truncated_keep_their_end(tok, caplog):
    long = chat(QUESTION * 6)
    config = PromptConfig(max_prompt_tokens=12, overlong_prompts="truncate")
    with caplog.at_level(logging.WARNING, logger="rlzoo.episodes.prompts"):
        assert fit_prompts([long], tok, config, "train") == [long]
    assert "1 of 1 prompts" in caplog.text and "truncated" in caplog.text
    ids = prompt_ids(tok, long, config)
    assert len(ids) == 12 and ids == prompt_ids(tok, long, PromptConfig())[-12:]
    assert text(tok, ids).endswith("<|im_start|>assistant\n")


def test_prompt_section_is_validated():
    with pytest.raises(ConfigError) as err:
        build_config({"prompt": {"chat_template_kwargs": {"add_generation_prompt": False}}})
    assert "prompt.chat_template_kwargs" in str(err.value) and "add_generation_prompt" in str(err.value)
    with pytest.raises(ConfigError, match="prompt.overlong_prompts"):
        build_config({"prompt": {"overlong_prompts": "cut"}})
    with pytest.raises(ConfigError, match="prompt.max_prompt_tokens"):
        build_config({"prompt": {"max_prompt_tokens": 0}})
    assert build_config({"prompt": {"chat_template_kwargs": {"enable_thinking": False}}}).prompt.chat_template_kwargs


class RecordingRollout(RolloutEngine):
    """Answers every prompt with a fixed response and records the prompt ids it was given."""

    name = "recording"

    def __init__(self, response: list[int]) -> None:
        super().__init__()
        self.response, self.seen = response, []

    def generate(self, prompts, sampling):
        self.seen.append([list(p) for p in prompts])
        return [
            [Generation(list(p), list(self.response), [-1.0] * len(self.response), True) for _ in range(sampling.n)]
            for p in prompts
        ]


def test_rollout_training_and_evaluation_see_identical_prompt_ids(tok):
    registry = default_registry()
    config = build_config(
        {
            "task": {"name": "arithmetic"},
            "rollout": {"group_size": 2, "max_new_tokens": 8},
            "prompt": {"system": "You are a careful solver.", "chat_template_kwargs": {"enable_thinking": False}},
        },
        registry=registry,
    )
    samples = [chat(), Sample("7*6=", "42"), chat("2+40?")]
    expected = [prompt_ids(tok, s, config.prompt) for s in samples]
    response = tok("\\boxed{42}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rollout = RecordingRollout(response)
    components = loop.Components(
        objective=None,
        advantage=registry.create("advantage", "group"),
        verifier=registry.create("verifier", "math"),
        correction=None,
        rollout=rollout,
        learner=None,
        tokenizer=tok,
    )
    collected = rollouts.collect(0, samples, components.rollout_parts(config), Timer())
    assert rollout.seen[0] == expected  # rollout
    batch = collected.batch  # training: prompt then response, row by row
    for row in range(batch.input_ids.shape[0]):
        start = int(batch.response_start[row])
        assert batch.input_ids[row, :start].tolist() == expected[row // 2]
    assert torch.equal(collected.rewards.rewards, torch.ones(6))  # the response decodes to \boxed{42}
    metrics = loop.evaluate(samples, rollout, components.verifier, tok, config)  # evaluation
    assert rollout.seen[1] == expected and metrics["eval/accuracy"] == 1.0


def test_config_check_refuses_chat_prompts_without_a_chat_template(tmp_path, tok):
    from rlzoo.config.schema import TinyModelConfig
    from rlzoo.models import build_tiny_model, save_model
    from rlzoo.preflight.checks import preflight

    registry = default_registry()
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}}\n')
    task = {"name": "dataset", "path": str(data), "layout": "verl"}
    base = {
        "output_dir": str(tmp_path / "run"),
        "task": task,
        "rollout": {"engine": {"name": "hf"}},
        "trainer": {"engine": {"name": "torch"}},
    }
    with pytest.raises(ConfigError, match="the cold start's character tokenizer has none"):
        preflight(build_config(base, registry=registry), registry)

    char = build_char_tokenizer("0123456789+?")
    plain_model = save_model(build_tiny_model(TinyModelConfig(), char), char, tmp_path / "plain")
    user = {**base, "model": {"path": str(plain_model)}, "cold_start": {"enabled": False}}
    with pytest.raises(ConfigError, match=r"has none \(no chat_template.jinja"):
        preflight(build_config(user, registry=registry), registry)

    chat_model = save_model(build_tiny_model(TinyModelConfig(), tok), tok, tmp_path / "chat")
    preflight(build_config({**user, "model": {"path": str(chat_model)}}, registry=registry), registry)  # accepted
    too_long = {**user, "model": {"path": str(chat_model)}, "prompt": {"max_prompt_tokens": 250}}
    with pytest.raises(ConfigError, match="prompt.max_prompt_tokens: 250 \\+ rollout.max_new_tokens 16 exceeds"):
        preflight(build_config(too_long, registry=registry), registry)
