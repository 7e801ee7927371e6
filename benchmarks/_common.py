"""Helpers the benchmark scripts share: engine specs, what is installed, and running one measured subprocess.

A measured subprocess (:func:`run_measured`) reports its exit code, its wall time, the peak memory of its whole
process tree (the sum of the members' RSS, sampled every 0.1 s with psutil when it is installed) and the largest
single process's peak RSS (``wait4``'s ``ru_maxrss``: exact, but blind to a tree of several processes), and,
when given a ``metrics.jsonl`` to watch, the time at which each of its lines appeared (polled every 2 ms: the
wall-clock length of each rlzoo step, logging and all, without touching rlzoo's code).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PHASES = ["rollout", "verify", "old_logprobs", "train", "sync"]
# whole specs, so a config's parameters for another engine never leak into this one
ENGINES = {
    "hf": "{name: hf}",
    "vllm": "{name: vllm, kv_cache_memory_bytes: 67108864}",
    "torch": "{name: torch}",
    "deepspeed": "{name: deepspeed, zero_stage: 2, moe: deepspeed}",
}
#: the tiny Qwen3-MoE of the benchmarks: the main job's model, read from its config so that the two cannot drift apart
MOE: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "gspo_tiny_moe.yaml").read_text())["model"]["tiny"]

# vLLM's own logging at ERROR: its INFO lines would fill the logs of short runs
QUIET = {"VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}


def available(module: str) -> bool:
    """Whether ``module`` imports in a fresh interpreter (vLLM changes process-wide state when imported)."""
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


@dataclass
class Measured:
    """What :func:`run_measured` saw of one subprocess."""

    returncode: int
    seconds: float
    peak_tree_rss_mb: float | None  # None without psutil
    peak_process_rss_mb: float
    log: Path
    line_times: list[tuple[float, dict]] = field(default_factory=list)  # (seconds since start, parsed line)


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for member in members:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_measured(args: list[str], log: Path, watch: Path | None = None, env: dict[str, str] | None = None) -> Measured:
    """Run ``args`` with stdout and stderr to ``log``; see the module docstring for what is measured."""
    try:
        import psutil  # noqa: F401

        have_psutil = True
    except ImportError:
        have_psutil = False
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **QUIET, **(env or {})})
        peak, lines, done = [0], [], threading.Event()

        def sample_memory() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss(proc.pid))
                done.wait(0.1)

        def watch_lines() -> None:
            offset, pending = 0, ""
            while True:
                finished = done.is_set()
                if watch is not None and watch.is_file() and watch.stat().st_size > offset:
                    now = time.perf_counter() - start
                    with open(watch) as handle:
                        handle.seek(offset)
                        chunk = handle.read()
                        offset = handle.tell()
                    pending += chunk
                    *complete, pending = pending.split("\n")
                    lines.extend((now, json.loads(text)) for text in complete if text.strip())
                if finished:
                    return
                time.sleep(0.002)

        threads = [threading.Thread(target=watch_lines, daemon=True)] if watch is not None else []
        if have_psutil:
            threads.append(threading.Thread(target=sample_memory, daemon=True))
        for thread in threads:
            thread.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        done.set()
        for thread in threads:
            thread.join()
    return Measured(
        returncode=proc.returncode,
        seconds=seconds,
        peak_tree_rss_mb=peak[0] / 2**20 if have_psutil else None,
        peak_process_rss_mb=usage.ru_maxrss / 1024,  # kilobytes on Linux
        log=log,
        line_times=lines,
    )


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def describe_model_folder(folder: Path) -> dict[str, Any]:
    """A pretrained model folder's size from its ``config.json`` alone (the model built on the meta device): all
    parameters, those active per token (routed experts counted ``top_k / experts``), vocabulary, a description."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    experts = getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None) or 0
    active = total - expert + (expert * getattr(hf, "num_experts_per_tok", 0) // experts if experts else 0)
    return {
        "parameters": total,
        "active_parameters": active,
        "vocab": hf.vocab_size,
        "description": f"{hf.model_type} {Path(folder).name}, hidden {hf.hidden_size}, {hf.num_hidden_layers} "
        f"layers, vocab {hf.vocab_size}, {total / 1e6:.1f}M parameters, pretrained",
    }
