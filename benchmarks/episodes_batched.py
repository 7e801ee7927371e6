"""Multi-turn episodes: every live episode's turn in one engine call, against each episode run on its own.

    python benchmarks/episodes_batched.py [--engine hf|vllm] [--prompts 8] [--group-size 8] [--repeats 5]
                                          [--warmup 1] [--max-turns 2] [--max-new-tokens 96] [--temperature 1.0]
                                          [--cold-start-steps 400] [--set k=v ...] [--work DIR] [--out DIR | --no-write]

The policy is the main job's tiny Qwen3-MoE (hidden 64, 2 layers, 8 experts, top-2), built locally and cold-started
(``rlzoo.runtime.assembly.initial_model_dir``: ``rlzoo.runtime.cold_start`` on the task's ``demonstration_turns``) on ``calculator-arithmetic``
(3-digit products; 80% of the demonstrations call ``calculator`` with ``<tool_call>{...}</tool_call>``, read the
``<tool_response>`` and answer), so the cold-start model calls the tool in most episodes. Episodes run in the
``tools`` environment with ``calculator``, at most ``--max-turns`` turns of at most ``--max-new-tokens`` tokens, in
a budget of 256 tokens. The cold start is cached under ``--work`` (default ``runs/bench-episodes-batched/``), in a
folder named by its settings' fingerprint, so a rerun with the same settings reuses it (nothing is downloaded).

One rollout engine (``--engine``; default ``vllm`` when it imports, else ``hf``) is started once and serves both
ways of running the same ``--prompts`` held-out prompts x ``--group-size`` episodes each:

- **batched**: one ``EpisodeRunner.run`` over all the prompts with ``n = group_size``: every live episode's turn
  in one engine call per turn, the environment answering a turn's episodes concurrently (as a run samples);
- **per-episode**: a loop that runs each episode on its own, one after the other: ``EpisodeRunner.run`` with one
  prompt and ``n = 1`` (one engine call per turn of that episode).

Both use the same runner, environment, sampling temperature and limits; each episode gets its own seed, so the two
sample different (equally distributed) episodes: the mean turns, tool calls, policy tokens, truncations and
correct answers per episode of each are printed to show they did comparable work. ``--warmup`` rounds of both run
first (untimed); then ``--repeats`` timed rounds, the order of the two alternating from round to round. Reported:
episodes/s of each (median over the rounds), their ratio (batched / per-episode: how many times more episodes per
second the batched turns run), the engine calls each made per round and the seconds spent inside them. Scoring is
outside the timings. ``--out DIR`` (default ``docs/benchmarks``) gets ``episodes_batched_<engine>.json``
(everything measured) and ``episodes_batched_<engine>.md`` (the table); ``--no-write`` writes nothing. Measured
numbers belong in docs/benchmarks.md, not here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from _common import ENGINES, MOE, QUIET, ROOT, available  # benchmarks/ is the script's directory, first on sys.path

MODES = ("batched", "per-episode")


def build_run_config(args: argparse.Namespace, registry: Any) -> Any:
    from rlzoo.config.resolution import build_config

    data = {
        "seed": 0,
        "output_dir": str(args.work),
        "model": {"path": None, "dtype": "float32", "tiny": MOE},
        "task": {"name": "calculator-arithmetic", "digits": 3, "operations": ["*"], "tool_demonstrations": 0.8},
        "episode": {
            "environment": {"name": "tools"},
            "tools": [{"name": "calculator"}],
            "max_turns": args.max_turns,
            "max_tokens": 256,
        },
        "cold_start": {"steps": args.cold_start_steps, "batch_size": 64, "lr": 3.0e-3, "examples": 4000},
        "rollout": {
            "engine": yaml.safe_load(ENGINES[args.engine]),
            "prompts_per_step": args.prompts,
            "group_size": args.group_size,
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
        },
        # the cold start's own held-out evaluation (recorded in its cold_start.json)
        "train": {"eval_prompts": 32, "eval_temperature": args.temperature, "eval_samples_per_prompt": 2},
    }
    return build_config(data, args.set, registry)


class CountedEngine:
    """The rollout engine, counting the calls the episode runner makes and the seconds spent inside them."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls, self.sequences, self.seconds = engine, 0, 0, 0.0

    def generate(self, prompts: list[list[int]], sampling: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.engine.generate(prompts, sampling)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1
            self.sequences += len(prompts) * sampling.n


def run_mode(mode: str, runner: Any, engine: Any, samples: list, sampling: Any, prompt: Any) -> tuple[dict, list]:
    """One round of ``mode`` over every sample: its wall time, engine calls, and the episodes (per sample)."""
    counted = CountedEngine(engine)
    tool_calls = 0.0
    start = time.perf_counter()
    if mode == "batched":
        ran = runner.run(counted, samples, sampling, prompt)
        groups = ran.groups
        tool_calls = float(ran.metrics.get("tool/calls", 0.0))
    else:
        groups = []
        for index, sample in enumerate(samples):
            group = []
            for j in range(sampling.n):
                seed = None if sampling.seed is None else (sampling.seed * 7919 + index * sampling.n + j) % 2**63
                ran = runner.run(counted, [sample], replace(sampling, n=1, seed=seed), prompt)
                group.append(ran.groups[0][0])
                tool_calls += float(ran.metrics.get("tool/calls", 0.0))
            groups.append(group)
    seconds = time.perf_counter() - start
    episodes = [g for group in groups for g in group]
    record = {
        "seconds": seconds,
        "episodes": len(episodes),
        "episodes_per_s": len(episodes) / seconds,
        "engine_calls": counted.calls,
        "engine_sequences": counted.sequences,
        "engine_seconds": counted.seconds,
        "turns": sum(len(g.turns) if g.turns else 1 for g in episodes),
        "tool_calls": tool_calls,
        "policy_tokens": sum(
            sum(g.policy_mask) if g.policy_mask is not None else len(g.response_ids) for g in episodes
        ),
        "observation_tokens": sum(
            len(g.policy_mask) - sum(g.policy_mask) for g in episodes if g.policy_mask is not None
        ),
        "truncated": sum(bool(g.truncated) for g in episodes),
    }
    return record, groups


def correct_answers(verifier: Any, tokenizer: Any, samples: list, groups: list) -> int:
    from rlzoo.rl.scoring import score
    from rlzoo.util.decode import response_text

    repeated = [s for s, group in zip(samples, groups, strict=True) for _ in group]
    responses = [response_text(tokenizer, g.last_turn_ids) for group in groups for g in group]
    return sum(bool(v.correct) for v in score(verifier, repeated, responses, 60.0).verdicts)


def summarise(rounds: list[dict]) -> dict[str, float]:
    episodes = sum(r["episodes"] for r in rounds)
    per_episode = lambda key: sum(r[key] for r in rounds) / episodes  # noqa: E731
    return {
        "episodes_per_s": statistics.median(r["episodes_per_s"] for r in rounds),
        "seconds": statistics.median(r["seconds"] for r in rounds),
        "engine_calls": statistics.median(r["engine_calls"] for r in rounds),
        "engine_seconds": statistics.median(r["engine_seconds"] for r in rounds),
        "turns_per_episode": per_episode("turns"),
        "tool_calls_per_episode": per_episode("tool_calls"),
        "policy_tokens_per_episode": per_episode("policy_tokens"),
        "observation_tokens_per_episode": per_episode("observation_tokens"),
        "truncated": per_episode("truncated"),
        "correct": per_episode("correct"),
    }


def table(summary: dict[str, dict[str, float]], episodes: int) -> str:
    head = (
        "| mode | episodes/s | s per round | engine calls | in engine s | turns/ep. | tool calls/ep. | "
        "policy tokens/ep. | truncated | correct |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode in MODES:
        s = summary[mode]
        lines.append(
            f"| {mode} ({episodes} episodes) | {s['episodes_per_s']:.2f} | {s['seconds']:.2f} | {s['engine_calls']:.0f} | "
            f"{s['engine_seconds']:.2f} | {s['turns_per_episode']:.2f} | {s['tool_calls_per_episode']:.2f} | "
            f"{s['policy_tokens_per_episode']:.1f} | {s['truncated']:.2f} | {s['correct']:.2f} |"
        )
    return "\n".join(lines)


def shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (the JSON names no machine's folders)."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--engine", choices=["hf", "vllm"], help="rollout engine (default: vllm if it imports, else hf)"
    )
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts (default 8)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per prompt (default 8)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed rounds of each mode; medians reported (default 5)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds of each mode first (default 1)")
    parser.add_argument("--max-turns", type=int, default=2, help="episode.max_turns (default 2: call, then answer)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="rollout.max_new_tokens, per turn (default 96)")
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature (default 1.0, as RL samples)"
    )
    parser.add_argument("--cold-start-steps", type=int, default=400, help="SFT steps of the cold start (default 400)")
    parser.add_argument("--seed", type=int, default=1, help="sampling seed of the first round (default 1)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override the run config")
    parser.add_argument(
        "--work",
        type=Path,
        default=ROOT / "runs" / "bench-episodes-batched",
        help="folder for the cached cold start (default runs/bench-episodes-batched)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "benchmarks",
        help="folder for episodes_batched_<engine>.json / .md (default docs/benchmarks)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only, write no files")
    args = parser.parse_args(argv)
    if args.engine is None:
        args.engine = "vllm" if available("vllm") else "hf"
    args.work = args.work.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    logging.basicConfig(level=logging.WARNING)
    sys.path.insert(0, str(ROOT))
    import torch

    from rlzoo.engines import SamplingSettings
    from rlzoo.episodes.assembly import build_episode_runner, create_tools, with_tool_descriptions
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import (
        engine_context,
        episode_context,
        initial_model_dir,
        load_tokenizer,
        make_task,
        verifier_for,
    )
    from rlzoo.runtime.cold_start import cold_start_fingerprint

    started = time.perf_counter()
    load_before = os.getloadavg()
    registry = default_registry()
    config = build_run_config(args, registry)
    fingerprint = cold_start_fingerprint(config)
    config = config.model_copy(
        update={
            "cold_start": config.cold_start.model_copy(
                update={"output_dir": str(args.work / f"cold_start_{fingerprint}")}
            )
        }
    )
    task = make_task(config, registry)
    say = lambda text: print(text, flush=True)  # noqa: E731
    say(f"cold start {config.cold_start.output_dir} ...")
    reused = (Path(config.cold_start.output_dir) / "cold_start.json").is_file()
    cold = time.perf_counter()
    model_dir = initial_model_dir(config, task, registry, progress=False)
    cold_seconds = time.perf_counter() - cold
    cold_report = json.loads((model_dir / "cold_start.json").read_text())
    say(
        f"cold start: {cold_seconds:.1f} s ({'reused' if reused else 'built'}); its held-out evaluation: "
        f"accuracy {cold_report.get('eval_accuracy')}, tool calls/episode {cold_report.get('eval_tool_calls_per_episode')}"
    )

    tools = create_tools(config, registry)
    config = with_tool_descriptions(config, tools)  # as a run does (plain-text prompts: no effect)
    tokenizer = load_tokenizer(model_dir)
    engine = registry.create("rollout_engine", config.rollout.engine.name, config.rollout.engine.params)
    engine.start(engine_context(config, model_dir, tokenizer))
    try:
        runner = build_episode_runner(config, registry, tokenizer, episode_context(engine, model_dir), tools)
        verifier = verifier_for(config, task, registry)
        samples = task.samples("eval", args.prompts, config.seed)
        sampling = SamplingSettings(
            n=args.group_size,
            max_new_tokens=config.rollout.max_new_tokens,
            temperature=args.temperature,
            top_p=1.0,
            seed=None,
        )
        rounds: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for round_ in range(args.warmup + args.repeats):
            timed = round_ >= args.warmup
            order = MODES if round_ % 2 == 0 else MODES[::-1]
            for mode in order:
                seed = args.seed + round_ * 2 + (mode == "per-episode")
                record, groups = run_mode(mode, runner, engine, samples, replace(sampling, seed=seed), config.prompt)
                record["correct"] = correct_answers(verifier, tokenizer, samples, groups)
                record.update(round=round_, warmup=not timed, seed=seed)
                say(
                    f"{'warm-up' if not timed else 'round'} {round_}: {mode:<12} {record['seconds']:7.2f} s  "
                    f"{record['episodes_per_s']:6.2f} episodes/s  {record['engine_calls']} engine calls"
                )
                if timed:
                    rounds[mode].append(record)
    finally:
        engine.close()

    summary = {mode: summarise(rounds[mode]) for mode in MODES}
    ratio = summary["batched"]["episodes_per_s"] / summary["per-episode"]["episodes_per_s"]
    paired = [b["episodes_per_s"] / p["episodes_per_s"] for b, p in zip(rounds["batched"], rounds["per-episode"])]
    episodes = args.prompts * args.group_size
    load_after = os.getloadavg()
    versions = {"torch": torch.__version__}
    if args.engine == "vllm":
        import vllm

        versions["vllm"] = vllm.__version__
    header = [
        f"# episodes_batched: {args.engine} engine, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"# policy: tiny Qwen3-MoE (hidden 64, 2 layers, 8 experts, top-2), cold start {args.cold_start_steps} steps; "
        f"task calculator-arithmetic (3-digit *); tools environment, calculator; max_turns {args.max_turns}, "
        f"max_new_tokens {args.max_new_tokens}/turn, episode budget 256 tokens, temperature {args.temperature}",
        f"# {args.prompts} held-out prompts x {args.group_size} episodes = {episodes} episodes per round; "
        f"{args.warmup} warm-up round(s), median of {args.repeats}; load average {load_before[0]:.2f} -> {load_after[0]:.2f}",
    ]
    text = (
        "\n".join(header)
        + "\n\n"
        + table(summary, episodes)
        + "\n\n"
        + (f"batched / per-episode: {ratio:.2f}x episodes/s (per round: {', '.join(f'{p:.2f}' for p in paired)})")
    )
    say("")
    say(text)
    result = {
        "benchmark": "episodes_batched",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "arch": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": load_after,
            **versions,
        },
        "settings": {k: (shown(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rollout_engine": config.rollout.engine.model_dump(mode="json"),
        "episode": config.episode.model_dump(mode="json"),
        "cold_start": {"path": shown(model_dir), "reused": reused, "seconds_this_run": cold_seconds, **cold_report},
        "episodes_per_round": episodes,
        "summary": summary,
        "ratio_episodes_per_s": ratio,
        "ratio_per_round": paired,
        "rounds": rounds,
        "seconds": time.perf_counter() - started,
    }
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"episodes_batched_{args.engine}"
        stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        stem.with_suffix(".md").write_text(text + "\n")
        say(f"written: {stem}.json, {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
