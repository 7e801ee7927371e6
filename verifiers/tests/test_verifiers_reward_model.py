"""The reward-model and weighted verifiers, with a tiny reward model trained here to tell right sums from wrong ones.

The trained model must order correct answers above incorrect ones on held-out problems, and an untrained one must
not: the test fails if the verifier ignores its model.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlzoo
from rlzoo.cli import main
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.interfaces import ModelFacts, RunFacts, Sample
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.models.memory import MemoryEstimate
from rlzoo.rl.scoring import score
from rlzoo.util.reductions import Max, Sum, reduce_minibatches
from rlzoo_verifiers.reward_model import weight_bytes

ALPHABET = "0123456789+-*="
# the reward model's chat template: each turn's text and an end-of-sequence token, in the char tokenizer's alphabet
TEMPLATE = "{% for message in messages %}{{ message['content'] }}{{ eos_token }}{% endfor %}"
STEPS, PROMPTS_PER_STEP = 250, 48


def held_out(a: int, b: int) -> bool:
    """One problem in ten, ``a+b`` and ``b+a`` together, is never trained on."""
    low, high = sorted((a, b))
    return (low * 7 + high * 13) % 10 == 0


def wrong(a: int, b: int, kind: str, rng: random.Random) -> int:
    """An incorrect answer: the digits of the right one reversed (``19`` -> ``91``), or another problem's answer.

    Not off by one or ten (``18``, ``29``): a model this small does not learn those within the test's few seconds
    of training (held out, it orders them barely better than chance)."""
    right = a + b
    if kind == "reversed":
        flipped = int(str(right)[::-1])
        return flipped if flipped != right else right + 10
    other = right
    while other == right:
        other = rng.randint(10, 99) + rng.randint(10, 99)
    return other


def reward_model_config(tokenizer):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )


def train_reward_model(tokenizer, seed: int = 0):
    """Bradley-Terry training: ``log sigmoid(r(right) - r(wrong))`` per problem and kind of wrong answer."""
    from transformers import Qwen3ForSequenceClassification

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return _train(Qwen3ForSequenceClassification(reward_model_config(tokenizer)), tokenizer, seed)


def _train(model, tokenizer, seed: int):
    vocab = tokenizer.get_vocab()
    eos = tokenizer.eos_token_id

    def ids(prompt: str, answer: int) -> list[int]:  # what the template renders, encoded (checked in a test)
        return [vocab[c] for c in prompt] + [eos] + [vocab[c] for c in str(answer)] + [eos]

    problems = [(a, b) for a in range(10, 100) for b in range(10, 100) if not held_out(a, b)]
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    warmup_cosine = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / STEPS))
    )
    model.train()
    for _ in range(STEPS):
        batch = rng.sample(problems, PROMPTS_PER_STEP)
        rows = [ids(f"{a}+{b}=", a + b) for a, b in batch]
        rows += [ids(f"{a}+{b}=", wrong(a, b, kind, rng)) for kind in ("reversed", "other") for a, b in batch]
        width = max(map(len, rows))
        input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        scores = model(input_ids=input_ids, attention_mask=(input_ids != tokenizer.pad_token_id).long()).logits[:, 0]
        right, wrongs = scores[:PROMPTS_PER_STEP], scores[PROMPTS_PER_STEP:]
        loss = -torch.nn.functional.logsigmoid(right.repeat(2) - wrongs).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        warmup_cosine.step()
    return model.eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is as fast as several, and never spins waiting for a core another process holds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """``trained``: the reward model trained above, with the chat template; ``untrained``: the same architecture at
    random initialisation, its tokenizer without a chat template; ``causal``: a causal LM folder."""
    from transformers import Qwen3ForSequenceClassification

    root = tmp_path_factory.mktemp("reward-models")
    tokenizer = build_char_tokenizer(ALPHABET)
    plain = build_char_tokenizer(ALPHABET)
    tokenizer.chat_template = TEMPLATE
    out = {"trained": save_model(train_reward_model(tokenizer), tokenizer, root / "trained")}
    with torch.random.fork_rng():
        torch.manual_seed(1)
        out["untrained"] = save_model(
            Qwen3ForSequenceClassification(reward_model_config(plain)), plain, root / "untrained"
        )
    from rlzoo.config.schema import TinyModelConfig

    tiny = TinyModelConfig(
        architecture="qwen3",
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    out["causal"] = save_model(build_tiny_model(tiny, plain), plain, root / "causal")
    return out


def reward_model(path: Path, **params):
    return rlzoo.default_registry().create("verifier", "reward-model", {"path": str(path), **params}, loc="verifier")


def held_out_pairs(count: int = 200) -> tuple[list[Sample], list[str], list[str]]:
    """Held-out problems, each with its right answer and a wrong one of each kind."""
    problems = [(a, b) for a in range(10, 100) for b in range(10, 100) if held_out(a, b)]
    rng = random.Random(123)
    chosen = rng.sample(problems, count)
    samples, right, wrongs = [], [], []
    for kind in ("reversed", "other"):
        for a, b in chosen:
            samples.append(Sample(f"{a}+{b}=", str(a + b)))
            right.append(str(a + b))
            wrongs.append(str(wrong(a, b, kind, rng)))
    return samples, right, wrongs


def ordering_accuracy(verifier) -> float:
    samples, right, wrongs = held_out_pairs()
    good = [v.reward for v in verifier.verify_batch(samples, right)]
    bad = [v.reward for v in verifier.verify_batch(samples, wrongs)]
    return sum(g > b for g, b in zip(good, bad, strict=True)) / len(good)


# -- the model is what scores -----------------------------------------------------------------------------------


def test_trained_reward_model_orders_right_above_wrong_on_held_out_problems(folders):
    trained = ordering_accuracy(reward_model(folders["trained"], batch_size=64))
    untrained = ordering_accuracy(reward_model(folders["untrained"], batch_size=64))
    print(f"held-out ordering accuracy: trained {trained:.3f}, untrained {untrained:.3f}")
    assert trained >= 0.8, trained
    assert untrained < 0.8, untrained  # the same check without the trained model fails


def test_conversation_is_rendered_with_the_chat_template(folders):
    with_template, plain = reward_model(folders["trained"]), reward_model(folders["untrained"])
    assert with_template.render(Sample("12+7=", "19"), "19") == "12+7=<eos>19<eos>"
    chat = Sample("ignored", "19", messages=[{"role": "user", "content": "12+"}, {"role": "user", "content": "7="}])
    assert with_template.render(chat, "19") == "12+<eos>7=<eos>19<eos>"
    # the ids the training used: the rendered text, encoded without added special tokens
    assert with_template.encode(Sample("12+7=", "19"), "19") == [7, 8, 4, 13, 16, 1, 7, 15, 1]
    assert plain.render(Sample("12+7=", "19"), "19") == "12+7=19"  # no chat template: prompt + response


def test_batches_score_as_one_response_at_a_time(folders):
    samples = [Sample(p, "") for p in ["1+1=", "12+34=", "99+99=", "5=", "123*456="]] * 2
    responses = ["2", "46", "198", "", "56088", "2222222222222", "4", "1", "0", "+-*="]
    batched = reward_model(folders["trained"], batch_size=4)
    alone = reward_model(folders["trained"], batch_size=1)
    together = batched.scores(samples, responses)
    one_by_one = [alone.verify(s, r).reward for s, r in zip(samples, responses, strict=True)]
    assert len(set(map(len, (batched.encode(s, r) for s, r in zip(samples, responses, strict=True))))) > 3
    assert together == pytest.approx(one_by_one, abs=1e-5)


def test_scale_shift_and_threshold(folders):
    samples, right, wrongs = held_out_pairs(20)
    responses = right[:20] + wrongs[:20]
    samples = samples[:20] * 2
    raw = reward_model(folders["trained"]).scores(samples, responses)
    threshold = sorted(raw)[len(raw) // 2]
    mapped = reward_model(folders["trained"], scale=-2.0, shift=0.5, threshold=threshold)
    verdicts = mapped.verify_batch(samples, responses)
    assert [v.reward for v in verdicts] == pytest.approx([-2.0 * s + 0.5 for s in raw], abs=1e-5)
    assert [v.correct for v in verdicts] == [s >= threshold for s in raw]
    assert mapped.judges_correctness()
    unjudged = reward_model(folders["trained"]).verify_batch(samples, responses)
    assert [v.reward for v in unjudged] == pytest.approx(raw, abs=1e-6)
    assert not any(v.correct for v in unjudged)  # threshold null: never correct, whatever the reward


def test_max_tokens_keeps_the_end_of_the_conversation(folders):
    sample = Sample("12+34=", "46")
    full = reward_model(folders["trained"]).encode(sample, "46")
    cut = reward_model(folders["trained"], max_tokens=4)
    assert len(full) == 10 and cut.encode(sample, "46") == full[-4:]  # <eos>46<eos>: the response's end is kept
    assert len(cut.scores([sample], ["46"])) == 1
    with pytest.raises(ConfigError, match="max_tokens"):
        reward_model(folders["trained"], max_tokens=0)


# -- weighted ---------------------------------------------------------------------------------------------------


def test_weighted_adds_weighted_rewards_and_takes_correctness_from_the_parts_that_judge_it(folders):
    registry = rlzoo.default_registry()
    rm = {"name": "reward-model", "path": str(folders["trained"]), "weight": 0.5}
    combined = registry.create("verifier", "weighted", {"verifiers": [{"name": "math"}, rm]})
    samples = [Sample("12+34=", "46")] * 4
    responses = ["46", "64", "46.0", ""]
    scores = reward_model(folders["trained"]).scores(samples, responses)
    verdicts = combined.verify_batch(samples, responses)
    assert [v.reward for v in verdicts] == pytest.approx([m + 0.5 * s for m, s in zip([1, 0, 1, 0], scores)], abs=1e-5)
    assert [v.correct for v in verdicts] == [
        True,
        False,
        True,
        False,
    ]  # math decides: the reward model has no threshold
    assert verdicts[3].reason == "math: no answer found in response"
    assert combined.verify(samples[1], "64").reward == pytest.approx(verdicts[1].reward, abs=1e-5)

    # with a threshold the reward model judges too: correct only where both agree
    strict = {**rm, "threshold": max(scores) + 1.0}
    both = registry.create("verifier", "weighted", {"verifiers": [{"name": "exact"}, strict]})
    assert [v.correct for v in both.verify_batch(samples, responses)] == [False] * 4
    chosen = registry.create("verifier", "weighted", {"verifiers": [{"name": "exact"}, strict], "correct_from": [0]})
    assert [v.correct for v in chosen.verify_batch(samples, responses)] == [True, False, False, False]
    alone = registry.create("verifier", "weighted", {"verifiers": [rm]})
    assert not alone.judges_correctness() and not any(v.correct for v in alone.verify_batch(samples, responses))


def test_weighted_reports_its_parts_mistakes_at_their_fields():
    registry = rlzoo.default_registry()
    bad = {
        "verifiers": [
            {"name": "exact", "strp": True},
            {"name": "mth"},
            {"name": "weighted", "verifiers": [{"name": "exact", "weight": "heavy"}]},
            {"name": "reward-model"},
            {"weight": 1.0},
        ],
        "correct_from": [7],
    }
    with pytest.raises(ConfigError) as info:
        registry.create("verifier", "weighted", bad, loc="verifier")
    fields = {field: message for field, message in info.value.problems}
    assert set(fields) == {
        "verifier.verifiers.0.strp",
        "verifier.verifiers.1.name",
        "verifier.verifiers.2.verifiers.0.weight",
        "verifier.verifiers.3.path",
        "verifier.verifiers.4.name",
    }, fields
    assert "did you mean 'strip'" in fields["verifier.verifiers.0.strp"]
    assert fields["verifier.verifiers.1.name"].startswith("unknown verifier 'mth'; did you mean 'math'?")
    with pytest.raises(ConfigError, match="verifier.correct_from.0: 7 is not a part's index"):
        registry.create("verifier", "weighted", {"verifiers": [{"name": "exact"}], "correct_from": [7]}, loc="verifier")
    resolved = registry.create("verifier", "weighted", {"verifiers": [{"name": "regex", "pattern": "x"}]}).params
    assert resolved.verifiers == [{"name": "regex", "weight": 1.0, "pattern": "x", "reward": 1.0, "fullmatch": True}]


# -- checks before a run ----------------------------------------------------------------------------------------


def write_config(tmp_path: Path, verifier: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(f"verifier: {verifier}\n")
    return path


def test_config_check_rejects_a_causal_lm_folder_at_the_field(folders, tmp_path, capsys):
    causal, trained = folders["causal"], folders["trained"]
    config = write_config(tmp_path, f"{{name: reward-model, path: {causal}}}")
    assert main(["config", "check", str(config)]) == 1
    err = capsys.readouterr().err
    assert (
        f"verifier.path: {causal} is a Qwen3ForCausalLM folder, not a sequence-classification model "
        "(...ForSequenceClassification)"
    ) in err, err
    assert "Traceback" not in err
    nested = write_config(
        tmp_path, f"{{name: weighted, verifiers: [{{name: math}}, {{name: reward-model, path: {causal}}}]}}"
    )
    assert main(["config", "check", str(nested)]) == 1
    assert f"verifier.verifiers.1.path: {causal} is a Qwen3ForCausalLM folder" in capsys.readouterr().err
    good = write_config(
        tmp_path,
        f"{{name: weighted, verifiers: [{{name: math}}, {{name: reward-model, path: {trained}, weight: 0.5}}]}}",
    )
    assert main(["config", "check", str(good)]) == 0, capsys.readouterr().err


def test_train_refuses_a_causal_lm_reward_model_without_a_traceback(folders, tmp_path):
    config = write_config(tmp_path, f"{{name: reward-model, path: {folders['causal']}}}")
    proc = subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", "train", str(config), "--set", f"output_dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "verifier.path:" in proc.stderr and "Qwen3ForCausalLM folder" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def run_facts(tmp_path: Path, memory: MemoryEstimate | None = None, device_memory: int | None = None) -> RunFacts:
    config = rlzoo.load_config(write_config(tmp_path, "null"))
    return RunFacts(
        config, ModelFacts(None, None, None), 1, rlzoo.default_registry(), memory=memory, device_memory=device_memory
    )


def test_preflight_reads_the_folder_metadata_only(folders, tmp_path):
    run = run_facts(tmp_path)
    assert reward_model(folders["trained"]).preflight(run, "verifier") == []
    two = tmp_path / "two-labels"
    two.mkdir()
    config = json.loads((folders["trained"] / "config.json").read_text())
    (two / "config.json").write_text(json.dumps({**config, "id2label": {"0": "bad", "1": "good"}}))
    problems = reward_model(two, max_tokens=65).preflight(run, "verifier.verifiers.0")
    messages = dict(problems)
    assert [field for field, _ in problems] == ["verifier.verifiers.0.path"] * 3 + ["verifier.verifiers.0.max_tokens"]
    assert (
        "has 2 labels" in problems[0][1] and "holds no weights" in problems[1][1] and "no tokenizer" in problems[2][1]
    )
    assert "exceeds the reward model's context (64 positions" in messages["verifier.verifiers.0.max_tokens"]
    assert "does not exist" in reward_model(tmp_path / "nowhere").preflight(run, "verifier")[0][1]


def test_preflight_counts_the_weights_against_the_device_memory(folders, tmp_path):
    verifier = reward_model(folders["trained"], dtype="float32")
    verifier.scores([Sample("1+1=", "")], ["2"])
    loaded = sum(p.numel() * 4 for p in verifier._model.parameters())
    assert weight_bytes(folders["trained"], "float32") == loaded  # from the safetensors headers alone
    assert weight_bytes(folders["trained"], "bfloat16") == loaded // 2
    estimate = MemoryEstimate({"weights": 1000}, parameters=0)
    fits = run_facts(tmp_path, estimate, device_memory=1000 + loaded)
    assert verifier.preflight(fits, "verifier") == []
    tight = run_facts(tmp_path, estimate, device_memory=1000 + loaded - 1)
    [(field, message)] = verifier.preflight(tight, "verifier")
    assert field == "verifier.path" and "do not fit beside the run's estimated" in message
    assert reward_model(folders["trained"], device="cpu").preflight(tight, "verifier") == []  # not on the GPU


# -- metrics and failures ---------------------------------------------------------------------------------------


def test_reward_model_time_and_memory_are_their_own_metrics(folders):
    verifier = reward_model(folders["trained"])
    samples, right, _ = held_out_pairs(10)
    first = score(verifier, samples, right).metrics()
    assert type(first["time/reward_model"]) is Sum and first["time/reward_model"] > 0
    assert first["time/reward_model_load"] > 0  # once, on the first scoring
    model = verifier._model
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) / 1e9
    assert type(first["memory/reward_model_weights_gb"]) is Max
    assert first["memory/reward_model_weights_gb"] == pytest.approx(weights)
    assert ("memory/reward_model_peak_gb" in first) == torch.cuda.is_available()
    second = score(verifier, samples, right, timeout_s=60).metrics()  # in a worker thread
    assert "time/reward_model_load" not in second and second["time/reward_model"] > 0
    both = reduce_minibatches([first, second])  # a step's generation batches: the times add up
    assert both["time/reward_model"] == pytest.approx(first["time/reward_model"] + second["time/reward_model"])
    assert verifier.take_phase_metrics() == {}  # taken by score

    combined = rlzoo.default_registry().create(
        "verifier",
        "weighted",
        {"verifiers": [{"name": "exact"}, {"name": "reward-model", "path": str(folders["trained"])}]},
    )
    metrics = score(combined, samples, right).metrics()
    assert metrics["time/reward_model"] > 0 and metrics["verifier/errors"] == 0
    assert (
        "time/reward_model" not in score(rlzoo.default_registry().create("verifier", "exact"), samples, right).metrics()
    )


def test_a_model_that_fails_to_load_costs_the_responses_not_the_run(folders, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in folders["trained"].iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    verifier = reward_model(broken)
    with pytest.raises(RlzooError, match="failed to load"):
        verifier.verify(Sample("1+1=", "2"), "2")
    result = score(verifier, [Sample("1+1=", "2")] * 3, ["2", "3", "4"])
    assert result.errors == 3 and all(v.reward == 0.0 for v in result.verdicts)
    assert "failed to load" in result.verdicts[0].reason
