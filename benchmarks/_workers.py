"""The subprocesses of ``benchmarks/vs_trl.py``: TRL's GRPOTrainer, the floors, and the shared evaluation.

    python benchmarks/_workers.py {trl,floor-generate,floor-train,evaluate} SPEC.json RESULT.json

``SPEC.json`` holds ``config`` and ``sets`` (the rlzoo run config and its ``--set`` overrides, which every
system reads the same way), ``model_dir`` (the shared cold-start folder) and the worker's own keys. Each worker
writes one JSON object to ``RESULT.json``. Every worker runs in its own process: vLLM fixes the process's torch
thread count, and each system's peak memory is measured per process tree.

- ``trl``: TRL's ``GRPOTrainer`` with GSPO settings mapped from the rlzoo config (:func:`trl_args`), on the same
  prompts in the same order (rlzoo's ``loop.sample_prompts`` for each step), rewarded by the rlzoo verifier through
  rlzoo's scoring; times each optimizer step with a ``TrainerCallback`` and sums them per rollout.
- ``floor-generate``: a bare ``vllm.LLM`` sampling one step's prompts x ``group_size`` responses.
- ``floor-train``: a plain transformers model: one no-grad forward over the rollout batch (the old log-probs)
  and ``minibatches_per_rollout`` x (forward + backward + grad clip + AdamW step), on a batch of the shape of the
  floor's generations, padded only to the longest row.
- ``evaluate``: rlzoo's held-out evaluation (``rlzoo.rl.loop.evaluate`` with the ``hf`` rollout engine) of each
  given model folder: the one evaluator every system's final weights go through.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def load(spec: dict[str, Any]):
    """The run config, task, verifier, tokenizer and train prompts exactly as an rlzoo run builds them."""
    from rlzoo.config.resolution import load_config
    from rlzoo.episodes.prompts import fit_prompts
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import load_tokenizer, make_task, verifier_for

    registry = default_registry()
    config = load_config(spec["config"], spec["sets"], registry)
    task = make_task(config, registry)
    verifier = verifier_for(config, task, registry)
    tokenizer = load_tokenizer(Path(spec["model_dir"]))
    train_set = fit_prompts(task.samples("train", None, config.seed), tokenizer, config.prompt, "train")
    return config, task, verifier, tokenizer, train_set, registry


def step_prompts(config, train_set, steps: int) -> list:
    """The prompts rlzoo trains on at steps 0..steps-1, concatenated in order."""
    from rlzoo.rl.loop import sample_prompts

    return [s for step in range(steps) for s in sample_prompts(train_set, step, config)]


# -- TRL -----------------------------------------------------------------------------------------------------------


def trl_args(config, out: Path, steps: int):
    """rlzoo's GSPO config as TRL GRPOConfig arguments; raises for an algorithm TRL's options cannot express."""
    from trl import GRPOConfig

    algo = config.algorithm
    clip = algo.clipper.params
    if algo.ratio.name not in ("token", "sequence"):  # TRL's importance_sampling_level, spelt as rlzoo's ratios
        raise SystemExit(f"vs_trl maps algorithm.ratio token / sequence to TRL; this config has {algo.ratio.name!r}")
    expected = {
        "advantage": (algo.advantage.name, "group"),
        "advantage.std_normalize": (algo.advantage.params.get("std_normalize"), True),
        "clipper": (algo.clipper.name, "ppo"),
        "aggregation": (algo.aggregation.name, "seq-mean-token-mean"),
        "kl_coef": (algo.kl_coef, 0.0),
        "correction": (algo.correction.name, "none"),
        "batch_filter": (algo.batch_filter.name, "none"),
        "reward_shaping": (len(algo.reward_shaping), 0),
        "regularisers": (len(algo.regularisers), 0),
        "old_logprobs": (algo.old_logprobs, "train"),
        "trainer.dtype": (config.trainer.dtype, "float32"),
        "model.dtype": (config.model.dtype, "float32"),
    }
    wrong = {k: v for k, (v, want) in expected.items() if v != want}
    if wrong:
        raise SystemExit(f"vs_trl compares GRPO / GSPO without KL in fp32 only; this config differs in {wrong}")
    rows = config.rollout.prompts_per_step * config.rollout.group_size
    minibatches = algo.minibatches_per_rollout
    if rows % minibatches:
        raise SystemExit(f"prompts_per_step x group_size = {rows} must divide into {minibatches} minibatches for TRL")
    beta1, beta2 = config.trainer.betas
    return GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,  # GRPOConfig defaults to bf16; rlzoo trains in fp32 here
        fp16=False,
        gradient_checkpointing=False,  # GRPOConfig defaults to True; rlzoo does not checkpoint
        seed=config.seed,
        # the ratio per token (GRPO) or per sequence, length-normalised (GSPO, Zheng et al. 2025), with the
        # config's clip range (GSPO: 1 - 3e-4, 1 + 4e-4)
        importance_sampling_level=algo.ratio.name,
        epsilon=clip["eps_low"],
        epsilon_high=clip["eps_high"],
        beta=0.0,
        loss_type="grpo",  # per-sequence mean of token means = rlzoo's seq-mean-token-mean
        scale_rewards="group",  # (r - group mean) / group std = rlzoo's group advantage, std_normalize
        num_iterations=1,
        mask_truncated_completions=False,
        # one rollout = prompts x group responses, cut into `minibatches` optimizer steps (no accumulation)
        num_generations=config.rollout.group_size,
        steps_per_generation=minibatches,  # TRL's generation_batch_size is then per-device batch x this = rows
        per_device_train_batch_size=rows // minibatches,
        gradient_accumulation_steps=1,
        max_steps=steps * minibatches,
        max_completion_length=config.rollout.max_new_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        top_k=0,
        # the optimizer rlzoo's engines build (rlzoo/engines/optimizer.py): fused AdamW, constant lr, same betas /
        # decay / clip; fused is also transformers' own default on torch >= 2.8
        learning_rate=config.trainer.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch_fused",
        adam_beta1=beta1,
        adam_beta2=beta2,
        weight_decay=config.trainer.weight_decay,
        max_grad_norm=config.trainer.grad_clip or 0.0,
        router_aux_loss_coef=0.0,  # rlzoo's engines train without the load-balancing loss by default
        shuffle_dataset=False,  # the dataset is already rlzoo's per-step prompt order
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
        use_vllm=False,
    )


def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOTrainer

    from rlzoo.episodes.prompts import chat_messages, prompt_ids
    from rlzoo.rl.scoring import score
    from rlzoo.util.decode import response_text

    config, _, verifier, tokenizer, train_set, _ = load(spec)
    steps, out = spec["steps"], Path(spec["out"])
    if config.prompt.chat_template_kwargs:
        raise SystemExit("vs_trl does not pass prompt.chat_template_kwargs to TRL; leave it empty")
    samples = step_prompts(config, train_set, steps)
    # TRL renders and tokenizes prompts itself: plain text as it is, messages through the chat template (as
    # rlzoo does for prompt.plain: chat and prompt.system). It must see exactly rlzoo's prompt tokens.
    prompts = [chat_messages(s, config.prompt) or s.prompt for s in samples]
    for s, prompt in zip(samples, prompts):
        if isinstance(prompt, str):
            theirs = tokenizer(prompt)["input_ids"]
        else:
            theirs = tokenizer.apply_chat_template(
                [prompt], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"][0]
        if list(theirs) != prompt_ids(tokenizer, s, config.prompt):
            raise SystemExit(f"TRL would tokenize prompt {prompt!r} differently from rlzoo")
    dataset = Dataset.from_dict({"prompt": prompts, "index": list(range(len(samples)))})
    tokens, verify_seconds = [], []

    def rlzoo_verifier(prompts, completions, completion_ids, index, **_):
        start = time.perf_counter()
        responses = [response_text(tokenizer, ids) for ids in completion_ids]
        scores = score(verifier, [samples[i] for i in index], responses, config.train.verifier_timeout_s)
        verify_seconds.append(time.perf_counter() - start)
        tokens.append(sum(len(ids) for ids in completion_ids))
        return [v.reward for v in scores.verdicts]

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.begin, self.ends = 0.0, []

        def on_train_begin(self, *args, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            self.ends.append(time.perf_counter())

    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    times = StepTimes()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=rlzoo_verifier,
        args=trl_args(config, out, steps),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[times],
    )
    trainer.train()
    minibatches = config.algorithm.minibatches_per_rollout
    marks = [times.begin, *times.ends]
    per_rollout = [marks[(k + 1) * minibatches] - marks[k * minibatches] for k in range(steps)]
    final = out / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    return {
        "step_seconds": per_rollout,
        "tokens_per_step": tokens[:steps],
        "verify_seconds": verify_seconds[:steps],
        "reward_mean": rewards[:steps],
        "final_model": str(final),
        "trl_version": __import__("trl").__version__,
    }


# -- floors --------------------------------------------------------------------------------------------------------


def floor_generate(spec: dict[str, Any]) -> dict[str, Any]:
    """Bare vLLM: one step's prompts x group_size responses, the run's sampling settings, timed per call."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process, as rlzoo's engine runs it
    import vllm
    from vllm.inputs import TokensPrompt

    from rlzoo.episodes.prompts import prompt_ids

    config, _, _, tokenizer, train_set, _ = load(spec)
    engine = spec["vllm_params"]
    llm = vllm.LLM(
        model=spec["model_dir"],
        tokenizer=spec["model_dir"],
        dtype=config.model.dtype,
        seed=config.seed,
        enforce_eager=engine.get("enforce_eager", True),
        kv_cache_memory_bytes=engine["kv_cache_memory_bytes"],
        max_model_len=engine.get("max_model_len"),
    )
    samples = step_prompts(config, train_set, 1)
    prompts = [TokensPrompt(prompt_token_ids=prompt_ids(tokenizer, s, config.prompt)) for s in samples]
    params = vllm.SamplingParams(
        n=config.rollout.group_size,
        max_tokens=config.rollout.max_new_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        top_k=0,
        stop_token_ids=[tokenizer.eos_token_id],
        detokenize=False,
    )
    seconds, tokens, rows = [], [], []
    for _ in range(spec["warmup"] + spec["repeats"]):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
        rows = [(len(o.prompt_token_ids), len(c.token_ids)) for o in outputs for c in o.outputs]
        tokens.append(sum(r for _, r in rows))
    seconds, tokens = seconds[spec["warmup"] :], tokens[spec["warmup"] :]
    return {
        "seconds": statistics.median(seconds),
        "tokens": statistics.median(tokens),
        "tokens_per_s": statistics.median(t / s for t, s in zip(tokens, seconds, strict=True)),
        "rows": rows,  # (prompt, response) lengths of the last call: the floor-train batch
    }


def floor_train(spec: dict[str, Any]) -> dict[str, Any]:
    """Plain transformers + torch's fused AdamW (as rlzoo's engines) on the rollout batch's shape: old log-probs +
    minibatch updates."""
    import torch
    from transformers import AutoModelForCausalLM

    config, _, _, tokenizer, _, _ = load(spec)
    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.trainer.lr,
        betas=tuple(config.trainer.betas),
        weight_decay=config.trainer.weight_decay,
        fused=True,
    )
    rows = spec["rows"]  # [(prompt length, response length)]
    width = max(p + r for p, r in rows)
    vocab = model.config.vocab_size
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, L]
    attention = torch.zeros_like(input_ids)
    response = torch.zeros(len(rows), width - 1)  # [B, L-1] 1 where position t predicts a response token
    for i, (p, r) in enumerate(rows):
        input_ids[i, : p + r] = torch.randint(3, vocab, (p + r,))
        attention[i, : p + r] = 1
        response[i, p - 1 : p + r - 1] = 1
    advantages = torch.randn(len(rows), 1)

    def logprobs(ids, mask):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # [b, L-1, V]
        return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [b, L-1]

    minibatches = torch.tensor_split(torch.randperm(len(rows)), config.algorithm.minibatches_per_rollout)
    old, train = [], []
    for _ in range(spec["warmup"] + spec["repeats"]):
        start = time.perf_counter()
        with torch.no_grad():
            logprobs(input_ids, attention)
        middle = time.perf_counter()
        for rows_ in minibatches:
            mask = response[rows_]
            logp = logprobs(input_ids[rows_], attention[rows_])
            loss = -((logp * advantages[rows_] * mask).sum(-1) / mask.sum(-1)).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.trainer.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.trainer.grad_clip)
            optimizer.step()
        old.append(middle - start)
        train.append(time.perf_counter() - middle)
    old, train = old[spec["warmup"] :], train[spec["warmup"] :]
    return {
        "old_logprobs": statistics.median(old),
        "train": statistics.median(train),
        "batch_shape": [len(rows), width],
    }


# -- evaluation ----------------------------------------------------------------------------------------------------


def evaluate(spec: dict[str, Any]) -> dict[str, Any]:
    """rlzoo's held-out accuracy of each folder in ``spec["models"]``, with the hf engine (same seed for all)."""
    from rlzoo.episodes.prompts import fit_prompts
    from rlzoo.rl import loop
    from rlzoo.runtime.assembly import engine_context, load_tokenizer

    config, task, verifier, _, _, registry = load(spec)
    results = {}
    for name, model_dir in spec["models"].items():
        tokenizer = load_tokenizer(Path(model_dir))
        samples = fit_prompts(
            task.samples("eval", config.train.eval_prompts, config.seed), tokenizer, config.prompt, "eval"
        )
        rollout = registry.create("rollout_engine", "hf")
        rollout.start(engine_context(config, Path(model_dir), tokenizer))
        results[name] = loop.evaluate(samples, rollout, verifier, tokenizer, config)
        rollout.close()
    return results


WORKERS = {"trl": run_trl, "floor-generate": floor_generate, "floor-train": floor_train, "evaluate": evaluate}


def main() -> int:
    kind, spec_path, result_path = sys.argv[1:4]
    result = WORKERS[kind](json.loads(Path(spec_path).read_text()))
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
