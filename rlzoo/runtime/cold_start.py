"""Cold start: supervised fine-tuning of the policy on task demonstrations before RL.

Loss: mean token cross-entropy of ``demonstration + <eos>`` given the prompt (prompt tokens are not trained);
the prompt is encoded by :func:`rlzoo.episodes.prompts.prompt_ids`, as RL encodes it. With multi-turn episodes
(``episode.max_turns`` > 1) a sample's ``demonstration_turns`` are trained instead, as the episode a rollout
would hold: every turn + ``<eos>`` trained, the environment's observations between them in the context only
(:meth:`rlzoo.episodes.runner.EpisodeRunner.demonstration`); one the environment fails on is left out and counted
(``demonstration_errors`` in ``cold_start.json``), and an environment that fails on all of them stops the build.
The result is an HF model folder with ``cold_start.json`` recording its held-out accuracy; a folder built from
the same settings is reused instead of trained again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlzoo.config.schema import RunConfig
from rlzoo.engines.tokens import make_token_batch, response_logprobs
from rlzoo.episodes.assembly import build_episode_runner
from rlzoo.episodes.prompts import fit_prompts, prompt_budget, prompt_ids
from rlzoo.episodes.runner import EnvironmentFailure
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Task
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.models.folder import ModelFolder
from rlzoo.registry import default_registry
from rlzoo.runtime.checkpoint.files import atomic_directory
from rlzoo.runtime.runlock import building

log = logging.getLogger("rlzoo.runtime.cold_start")


def cold_start_dir(config: RunConfig) -> Path:
    if config.cold_start.output_dir:
        return Path(config.cold_start.output_dir)
    return Path(config.output_dir) / "cold_start"


def cold_start_fingerprint(config: RunConfig) -> str:
    """What a cold-start model depends on, hashed: an existing one with the same fingerprint is reused."""
    relevant = {
        "seed": config.seed,
        "task": config.task.model_dump(mode="json"),
        "prompt": config.prompt.model_dump(mode="json"),
        "tiny": config.model.tiny.model_dump(mode="json"),
        "cold_start": config.cold_start.model_dump(mode="json", exclude={"output_dir"}),
    }
    if config.episode.max_turns > 1:  # multi-turn demonstrations hold the environment's observations
        relevant["episode"] = config.episode.model_dump(mode="json")
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def ensure_cold_start(
    config: RunConfig, task: Task, evaluate_fn: Any = None, progress: bool = True, registry: Any = None
) -> Path:
    """Return a cold-start model folder for this config, training it first unless an identical one exists."""
    directory = cold_start_dir(config)
    fingerprint = cold_start_fingerprint(config)
    if _reusable(directory, fingerprint):
        return directory
    # built under a lock (rlzoo.runtime.runlock): a run that needs the folder while another process builds it (the runs of
    # a sweep share one) waits for it, then uses it
    with building(directory):
        if _reusable(directory, fingerprint, warn=False):  # a damage found above was warned about there
            print(f"cold start: using {directory}, built meanwhile by another process", file=sys.stderr, flush=True)
            return directory
        train_cold_start(config, task, directory, fingerprint, evaluate_fn, progress, registry)
    return directory


def _reusable(directory: Path, fingerprint: str, warn: bool = True) -> bool:
    """Whether ``directory`` holds a finished, intact cold start of these settings; one of other settings is an
    error. A damaged one (an unreadable ``cold_start.json``, weights whose safetensors header does not cover the file)
    is derived data: it is built again, with a warning naming what was damaged, rather than loaded into a traceback."""
    report = directory / "cold_start.json"
    if not report.is_file():
        return False
    try:
        previous = json.loads(report.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        previous = f"{report} is not readable JSON ({type(err).__name__}: {err})"
    if not isinstance(previous, dict):
        if warn:
            log.warning(
                "cold-start model %s is damaged: %s; building it again",
                directory,
                previous if isinstance(previous, str) else f"{report} is not a JSON object",
            )
        return False
    if previous.get("fingerprint") != fingerprint:
        raise RlzooError(
            f"{directory} holds a cold-start model built from other settings; delete it or set cold_start.output_dir"
        )
    if damaged := ModelFolder.read(directory).weight_problems():
        if warn:
            log.warning("cold-start model %s is damaged: %s; building it again", directory, damaged[0])
        return False
    accuracy = previous.get("eval_accuracy", float("nan"))
    log.info("reusing cold-start model %s (held-out accuracy %.3f)", directory, accuracy)
    return True


def train_cold_start(
    config: RunConfig,
    task: Task,
    directory: Path,
    fingerprint: str,
    evaluate_fn: Any = None,
    progress: bool = True,
    registry: Any = None,
) -> dict[str, Any]:
    cs = config.cold_start
    torch.manual_seed(config.seed)
    tokenizer = build_char_tokenizer(task.alphabet())
    examples, left_out = _demonstrations(config, task, tokenizer, registry or default_registry())
    model = build_tiny_model(config.model.tiny, tokenizer, seed=config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cs.lr, weight_decay=0.0)
    schedule = one_cycle(optimizer, cs.lr, cs.steps)
    rng = random.Random(config.seed)
    start = time.perf_counter()
    bar = tqdm(range(cs.steps), desc="cold start (SFT)", disable=not progress, dynamic_ncols=True)
    for _ in bar:
        chosen = rng.sample(examples, k=min(cs.batch_size, len(examples)))
        batch = make_token_batch(
            [prompt for prompt, _, _ in chosen],
            [response for _, response, _ in chosen],
            tokenizer.pad_token_id,
            policy_masks=[mask for _, _, mask in chosen],
        )
        logp = response_logprobs(model, batch)
        loss = -(logp.sum() / batch.response_mask.sum())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    elapsed = time.perf_counter() - start
    result: dict[str, Any] = {
        "fingerprint": fingerprint,
        "steps": cs.steps,
        "seconds": round(elapsed, 1),
        "final_loss": loss.item() if cs.steps else None,
    }
    if left_out:  # demonstrations the environment failed on (only then: a cold start without faults is as it was)
        result["demonstration_errors"] = left_out
    with atomic_directory(directory) as tmp:
        save_model(model, tokenizer, tmp)
        if evaluate_fn is not None:
            result.update({k.replace("eval/", "eval_"): v for k, v in evaluate_fn(tmp).items()})
        (tmp / "cold_start.json").write_text(json.dumps(result, indent=2))
    log.info("cold start done in %.0f s: %s", elapsed, result)
    return result


def demonstrations(
    config: RunConfig, task: Task, tokenizer: Any, registry: Any
) -> list[tuple[list[int], list[int], list[int] | None]]:
    """``(prompt ids, response ids, policy mask)`` of each demonstration: ``demonstration + <eos>`` (mask
    ``None``: all trained), or with multi-turn episodes the sample's ``demonstration_turns`` as an episode (those the
    environment fails on left out)."""
    return _demonstrations(config, task, tokenizer, registry)[0]


def _demonstrations(
    config: RunConfig, task: Task, tokenizer: Any, registry: Any
) -> tuple[list[tuple[list[int], list[int], list[int] | None]], int]:
    """:func:`demonstrations`, and how many the environment failed on (left out, its first failure warned)."""
    budget = prompt_budget(config.model.tiny.max_position_embeddings, config.rollout.max_new_tokens)
    samples = fit_prompts(
        task.samples("train", config.cold_start.examples, config.seed), tokenizer, config.prompt, "cold-start", budget
    )
    runner = build_episode_runner(config, registry, tokenizer, config.model.tiny.max_position_embeddings)
    encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    out: list[tuple[list[int], list[int], list[int] | None]] = []
    failures: list[str] = []
    for sample in samples:
        if runner.multi_turn and sample.demonstration_turns:
            try:
                out.append(runner.demonstration(sample, config.prompt))
            except EnvironmentFailure as failure:
                failures.append(str(failure))
        elif sample.demonstration is not None:
            out.append(
                (
                    prompt_ids(tokenizer, sample, config.prompt),
                    encode(sample.demonstration) + [tokenizer.eos_token_id],
                    None,
                )
            )
    if failures and not out:
        raise RlzooError(
            f"the cold start has nothing to train on: the environment failed on all {len(failures)} of its "
            f"demonstrations ({failures[0]}); fix it, or start from a trained model (model.path)"
        )
    if failures:
        log.info(
            "cold start: %d of %d demonstrations left out: the environment failed on them",
            len(failures),
            len(failures) + len(out),
        )
    if not out:
        raise RlzooError(f"task {task.name!r} has no demonstrations: cold start needs them (or set model.path)")
    return out, len(failures)


def one_cycle(optimizer: torch.optim.Optimizer, lr: float, steps: int) -> torch.optim.lr_scheduler.OneCycleLR:
    """The cold start's schedule: one cycle peaking at ``lr`` after 10% of the steps. Its warm-up ends at step
    ``pct_start * steps - 1``, and torch divides by that length: a short cold start gets a warm-up of two steps, so
    the length is never zero (10 steps: 0.1 * 10 - 1 = 0) nor negative (fewer than 10)."""
    total = max(steps, 1)
    pct_start = 0.1 if total < 3 else max(0.1, 2 / total)
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total, pct_start=pct_start)
