"""LoRA against full fine-tuning, in one run: the peak memory of a training step, and the cost of each weight sync.

    python benchmarks/lora.py [--scale tiny|long] [--rank 8] [--alpha 16] [--targets q_proj,k_proj,...]
                              [--engines torch,deepspeed] [--length 256] [--prompts 4] [--group-size 8]
                              [--budget 2048] [--warmup 1] [--repeats 1] [--max-updates N]
                              [--rollouts vllm,hf] [--sync-trainer torch|deepspeed] [--rounds 10] [--sync-warmup 2]
                              [--skip-memory] [--skip-sync] [--out DIR] [--work DIR]

The model is the scale's policy (``examples/bench/<scale>.yaml``; ``long``, the default: a 13.4M-parameter
Qwen3-MoE, hidden 256, 4 layers, 8 experts, top 2), built once with random weights (``memory_scaling.build_model``)
and shared by every measurement below. The adapters are ``model.lora`` with ``--rank`` (8), ``--alpha`` (16),
dropout 0 and ``--targets`` (default: attention and the fused experts, ``q_proj, k_proj, v_proj, o_proj,
experts.gate_up_proj, experts.down_proj``); the router, norms and embeddings never train.

1. Memory of one training step (skip with ``--skip-memory``). For each training engine in ``--engines`` and each
   of full fine-tuning and LoRA, one point of ``benchmarks/memory_scaling.py``: its ``--worker`` in a fresh process,
   measured with ``_common.run_measured``. The point is the training half of an RL step with the config's algorithm
   (GSPO, ``minibatches_per_rollout`` 2) through the learner a run builds: ``old_logprobs`` over a synthetic rollout
   batch of ``--prompts`` x ``--group-size`` rows (random response tokens, lengths uniform in ``[length/2,
   length]``, ``--length`` 256), then one ``update`` per minibatch, under ``trainer.max_tokens_per_micro_batch =
   --budget`` (2048); ``--warmup`` steps, then the median of ``--repeats``. Both points of an engine see the same
   batch, budget and engine settings; the LoRA point adds ``--set model.lora={...}``, so the engine wraps the model
   with peft, freezes every base weight and gives AdamW the adapters only. Reported per point: the trainable
   parameters (``requires_grad``, counted by the worker), peak MB (the worker's ``ru_maxrss``: imports, model,
   optimizer state, every step), base MB (its RSS just before the first step), step MB = peak - base (activations,
   and the gradients and AdamW state the first update allocates) and step s; then LoRA / full per engine. The
   DeepSpeed engine runs the config's own spec (ZeRO-2 with DeepSpeed-MoE for both bench configs) unless its
   ``adapter_targets_supported`` refuses the targets (DeepSpeed-MoE replaces the fused experts an
   ``experts.*`` target names): then both of its points use ``moe: none``, and the output says so.

2. Weight sync (skip with ``--skip-sync``). For each rollout engine in ``--rollouts`` (default: ``vllm`` when it
   imports, and ``hf``), in a fresh process of this script (``--sync-worker``; vLLM changes process-wide state),
   with two in-process training engines of ``--sync-trainer`` (default ``torch``) on the model, one training every
   weight and one started with the adapters. Each path runs in turn on its own rollout engine, started as a run on
   that path starts it (a rollout engine that loads adapters refuses full weights and the reverse), and closed
   before the next; every round first perturbs what the training engine trains (``+= 1e-3 * N(0, 1)``: every weight
   of the full engine; every ``lora_A`` / ``lora_B`` of the LoRA engine, whose ``B`` starts at zero), then times
   the path's two parts, prepare and sync:

   - full (a full fine-tuning run): rollout engine started without LoRA; ``named_weights()`` of the full engine
     (views of the live weights in checkpoint names) materialised as a list, then ``sync_weights`` of it.
   - merged (``model.lora.sync: merged``): rollout engine started with ``EngineContext(lora=...)``, sync
     ``merged``; ``named_weights()`` of the LoRA engine, i.e. ``rlzoo.engines.lora.merged_weights`` (``W + scale *
     B A`` for every target, out of place, then the per-expert checkpoint layout) materialised as a list (the
     merge), then ``sync_weights`` of the merged tensors.
   - adapter (``model.lora.sync: adapter``): rollout engine started with ``EngineContext(lora=...)``, sync
     ``adapter``; ``adapter(version)`` (peft's adapter state dict, copied to the CPU), then ``sync_adapter``. The
     rollout engine's ``adapter_targets_supported(targets, moe)`` is asked before it starts, as a run asks it; where
     it gives a reason, the row reads "not supported by this build: <reason>" instead of timings (vLLM on an MoE
     model with ``experts.*`` targets, for one: try ``--targets q_proj,k_proj,v_proj,o_proj``).

   The phases run one after the other (full, merged, adapter), not interleaved, so a change of load from other work
   between them shows up in their ratios; compare runs on a quiet machine.
   Each column is the median over ``--rounds`` rounds after ``--sync-warmup`` dropped ones; ``ms per sync`` is the
   median of each round's prepare + sync (what one sync of that path costs the loop). ``bytes sent``: the total size
   of the tensors handed to the rollout engine (``sync_weights``: every checkpoint tensor as the training engine
   gives it, fp32 here; ``sync_adapter``: the adapter tensors). ``x full``: the path's ms per sync (and its sync call
   alone) over the full path's. ``runs on``: the device of each part (the merge runs on the training engine's
   device, ``adapter()`` copies to the CPU, the sync call on the rollout engine's device).

Prints both tables. ``--out DIR`` writes ``lora_<scale>.json`` (everything measured) and ``lora_<scale>.txt`` (the
tables). Measured numbers belong in docs/benchmarks.md, not here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from _common import ENGINES, ROOT, available, log_tail, run_measured  # benchmarks/ is first on sys.path
from memory_scaling import build_model, engine_sets, fmt, has_micro_batching, prompt_pool

MEMORY_SCRIPT = Path(__file__).resolve().parent / "memory_scaling.py"
DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,experts.gate_up_proj,experts.down_proj"
TRAINERS = ["torch", "deepspeed"]
ROLLOUTS = ["vllm", "hf"]
PATHS = ["full", "merged", "adapter"]


# -- configuration shared by the driver and the workers -------------------------------------------------------------


def lora_set(args: argparse.Namespace) -> str:
    """The ``--set`` item that turns LoRA on (JSON is YAML flow syntax)."""
    lora = {"rank": args.rank, "alpha": args.alpha, "dropout": 0.0, "target_modules": args.targets, "sync": "auto"}
    return f"model.lora={json.dumps(lora)}"


def trainer_sets(engine: str, config_path: Path, sets: list[str], lora: str, model_dir: Path) -> tuple[list[str], str]:
    """The ``--set`` items selecting training engine ``engine`` for both the full and the LoRA point, and a note.

    The config's own spec for that engine (``memory_scaling.engine_sets``), unless the engine's
    ``adapter_targets_supported`` refuses the LoRA targets; for DeepSpeed-MoE (which replaces the fused experts an
    ``experts.*`` target names) the same spec with ``moe: none`` then, used for both points alike."""
    from rlzoo.config.resolution import load_config
    from rlzoo.engines.lora import skeleton, split_targets, target_names
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import create

    chosen = engine_sets(engine, str(config_path))
    config = load_config(config_path, [*sets, *chosen, lora])
    _, fused, unknown = split_targets(skeleton(model_dir), config.model.lora.target_modules)
    if unknown:
        raise SystemExit(
            f"--targets: {unknown} name no projection of this model; use some of {target_names(skeleton(model_dir))}"
        )
    reason = create(default_registry(), "training_engine", config.trainer.engine).adapter_targets_supported(fused)
    if reason is None:
        return chosen, ""
    params = config.trainer.engine.params
    if engine == "deepspeed" and params.get("moe") == "deepspeed":
        spec = {"name": engine, **params, "moe": "none"}
        return [f"trainer.engine={json.dumps(spec)}"], (
            f"moe: none for both points (with moe: deepspeed it refuses these targets: {reason})"
        )
    raise SystemExit(f"training engine {engine!r} cannot train adapters on {fused}: {reason}")


def describe_spec(sets: list[str]) -> str:
    return next((s.split("=", 1)[1] for s in sets if s.startswith("trainer.engine=")), "?")


# -- 1. memory: memory_scaling.py's worker, one point per (engine, full / LoRA) ---------------------------------------


def memory_point(args, config, config_path: Path, sets: list[str], work: Path, name: str) -> dict[str, Any]:
    spec = {
        "config": str(config_path),
        "sets": sets,
        "model_dir": str(work / "model"),
        "length": args.length,
        "prompts": args.prompts,
        "pool": args.prompts,
        "group_size": args.group_size,
        "seed": config.seed,
        "micro_batching": has_micro_batching(),
        "budget": args.budget,
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
        [sys.executable, str(MEMORY_SCRIPT), "--worker", str(folder / "spec.json"), str(result_path)],
        folder / "worker.log",
    )
    point: dict[str, Any] = {
        "seconds": measured.seconds,
        "log": str(measured.log),
        "load": round(os.getloadavg()[0], 2),
    }
    if measured.returncode == 0 and result_path.is_file():
        r = json.loads(result_path.read_text())
        point.update(
            status="ok",
            **r,
            peak_mb=measured.peak_process_rss_mb,
            peak_tree_mb=measured.peak_tree_rss_mb,
            step_mb=measured.peak_process_rss_mb - r["base_rss_mb"],
        )
        print(
            f"  {name}: peak {point['peak_mb']:.0f} MB (base {r['base_rss_mb']:.0f}), step {r['step_s']:.2f} s, "
            f"{r['trainable_parameters']:,} trainable; worker {measured.seconds:.0f} s",
            flush=True,
        )
    else:
        point["status"] = f"failed (exit {measured.returncode})"
        print(f"  {name}: FAILED, log {measured.log}:\n{log_tail(measured.log)}", flush=True)
    return point


def run_memory(args, config, config_path: Path, sets: list[str], work: Path) -> dict[str, Any]:
    lora = lora_set(args)
    out: dict[str, Any] = {}
    for engine in args.engines:
        chosen, note = trainer_sets(engine, config_path, sets, lora, work / "model")
        if note:
            print(f"# {engine}: {note}", flush=True)
        rows = {}
        for kind in ("full", "lora"):
            point_sets = [*sets, *chosen, *([lora] if kind == "lora" else [])]
            rows[kind] = memory_point(args, config, config_path, point_sets, work, f"memory_{engine}_{kind}")
        out[engine] = {"spec": describe_spec(chosen), "note": note, **rows}
    return out


def memory_table(memory: dict[str, Any], args) -> list[str]:
    lines = [
        f"{'engine':<10}{'weights trained':<22}{'trainable':>12}{'share':>8}{'peak MB':>9}{'base MB':>9}"
        f"{'step MB':>9}{'step s':>8}{'cpu s':>7}",
    ]
    ratios = []
    for engine, rows in memory.items():
        total = rows["full"].get("parameters")
        for kind in ("full", "lora"):
            p = rows[kind]
            label = "all (full fine-tuning)" if kind == "full" else f"LoRA r{args.rank} ({len(args.targets)} targets)"
            if p["status"] != "ok":
                lines.append(f"{engine:<10}{label:<22}  {p['status']} (log {p['log']})")
                continue
            share = p["trainable_parameters"] / (total or p["parameters"])
            lines.append(
                f"{engine:<10}{label:<22}{p['trainable_parameters']:>12,}{share:>8.1%}{p['peak_mb']:>9.0f}"
                f"{p['base_rss_mb']:>9.0f}{p['step_mb']:>9.0f}{p['step_s']:>8.2f}{fmt(p.get('step_cpu_s'), '.1f'):>7}"
            )
        full, tuned = rows["full"], rows["lora"]
        if full["status"] == "ok" and tuned["status"] == "ok":
            step = tuned["step_mb"] / full["step_mb"] if full["step_mb"] > 0 else None
            ratios.append(
                f"{engine}: LoRA / full: peak memory x{tuned['peak_mb'] / full['peak_mb']:.2f}, step memory "
                f"x{fmt(step, '.2f')}, step time x{tuned['step_s'] / full['step_s']:.2f}"
            )
        if rows["note"]:
            ratios.append(f"{engine}: {rows['note']}")
    specs = "; ".join(f"{engine} {rows['spec']}" for engine, rows in memory.items())
    return (
        lines
        + ratios
        + [
            f"engines: {specs}",
            "peak MB: the worker process's peak RSS (ru_maxrss); base MB: its RSS just before the first step; step MB =",
            "peak - base; step s: old log-probs + updates, wall clock, median of the repeats; cpu s: the step's CPU seconds",
        ]
    )


# -- 2. sync: one process per rollout engine --------------------------------------------------------------------------


def sync_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from rlzoo.config.resolution import load_config
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import create, engine_context, load_tokenizer

    model_dir = Path(spec["model_dir"])
    config = load_config(spec["config"], spec["sets"])
    lora = config.model.lora
    tokenizer = load_tokenizer(model_dir)
    registry = default_registry()
    total_rounds, warmup = spec["warmup"] + spec["rounds"], spec["warmup"]

    def context(with_lora: bool):
        return engine_context(config, model_dir, tokenizer, lora=lora if with_lora else None)

    def trainer(with_lora: bool):
        engine = create(registry, "training_engine", config.trainer.engine)
        engine.start(context(with_lora), config.trainer)
        return engine

    @torch.no_grad()
    def perturb(engine) -> None:  # the full engine: every weight; the LoRA engine: the adapters (all that trains)
        for param in engine.model.parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param), alpha=1e-3)

    def nbytes(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    def rollout_device(rollout) -> str:
        model = getattr(rollout, "model", None)
        if isinstance(model, torch.nn.Module):
            return str(next(model.parameters()).device.type)
        try:
            from vllm.platforms import current_platform

            return str(current_platform.device_type)
        except Exception:  # noqa: BLE001 - a label only
            return "?"

    def summary(times: list[tuple[float, float]], **extra) -> dict[str, Any]:
        kept = times[warmup:]
        return {
            "prepare_ms": statistics.median(p for p, _ in kept) * 1e3,
            "sync_ms": statistics.median(s for _, s in kept) * 1e3,
            "total_ms": statistics.median(p + s for p, s in kept) * 1e3,
            "rounds_ms": [[p * 1e3, s * 1e3] for p, s in times],
            **extra,
        }

    def failure(path: str, exc: BaseException) -> str:
        print(f"{path}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}", flush=True)
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]

    full, tuned = trainer(False), trainer(True)
    moe = full.moe_layout() is not None
    train_device = str(next(tuned.model.parameters()).device.type)

    # one phase per path, each on a fresh rollout engine started as a run with that path starts it
    def phase(path: str, rollout_lora, engine, prepare, send, payload_tensors, runs_on: str) -> dict[str, Any]:
        rollout = create(registry, "rollout_engine", config.rollout.engine)
        if path == "adapter":
            reason = rollout.adapter_targets_supported(
                list(lora.target_modules), moe
            )  # asked before start, as a run does
            if reason is not None:
                return {"unsupported": reason}
        try:
            rollout.start(engine_context(config, model_dir, tokenizer, rollout_lora, sends_adapters=path == "adapter"))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            return {"error": f"start: {failure(path, exc)}"}
        device = rollout_device(rollout)
        try:
            times = []
            for _ in range(total_rounds):
                perturb(engine)
                start = time.perf_counter()
                payload = prepare()
                middle = time.perf_counter()
                send(rollout, payload)
                times.append((middle - start, time.perf_counter() - middle))
            tensors = list(payload_tensors(payload))
            return summary(
                times,
                bytes=nbytes(tensors),
                tensors=len(tensors),
                rollout_device=device,
                runs_on=runs_on.format(train=train_device, rollout=device),
            )
        except Exception as exc:  # noqa: BLE001 - the other paths go on
            return {"error": failure(path, exc)}
        finally:
            rollout.close()

    versions = iter(range(1, 1 << 30))
    paths = {
        # full fine-tuning: the rollout engine without LoRA, every weight of the full engine
        "full": phase(
            "full",
            None,
            full,
            lambda: list(full.named_weights()),
            lambda r, w: r.sync_weights(w),
            lambda w: (t for _, t in w),
            "named_weights: {train}, sync: {rollout}",
        ),
        # LoRA, model.lora.sync: merged: the rollout engine built without adapters receives the merged weights
        "merged": phase(
            "merged",
            lora.model_copy(update={"sync": "merged"}),
            tuned,
            lambda: list(tuned.named_weights()),
            lambda r, w: r.sync_weights(w),
            lambda w: (t for _, t in w),
            "merge: {train}, sync: {rollout}",
        ),
        # LoRA, model.lora.sync: adapter: the rollout engine built with the adapters' targets receives them
        "adapter": phase(
            "adapter",
            lora.model_copy(update={"sync": "adapter"}),
            tuned,
            lambda: tuned.adapter(next(versions)),
            lambda r, a: r.sync_adapter(a),
            lambda a: a.tensors.values(),
            "adapter(): {train} -> cpu copy, sync: {rollout}",
        ),
    }
    rollout_devices = {p.get("rollout_device") for p in paths.values()} - {None}
    return result_of(spec, paths, moe, train_device, ", ".join(sorted(rollout_devices)) or "?")


def result_of(spec, paths, moe, train_device, rollout_device) -> dict[str, Any]:
    import torch

    return {
        "rollout": spec["rollout"],
        "trainer": spec["trainer"],
        "moe": moe,
        "train_device": train_device,
        "rollout_device": rollout_device,
        "torch_threads": torch.get_num_threads(),
        "rounds": spec["rounds"],
        "warmup": spec["warmup"],
        "paths": paths,
    }


def run_sync(args, config_path: Path, sets: list[str], work: Path) -> dict[str, Any]:
    lora = lora_set(args)
    chosen, note = trainer_sets(args.sync_trainer, config_path, sets, lora, work / "model")
    if note:
        print(f"# sync, {args.sync_trainer}: {note}", flush=True)
    out: dict[str, Any] = {}
    for name in args.rollouts:
        if name == "vllm" and not available("vllm"):
            out[name] = {"status": "vllm does not import here (benchmarks/_common.available)"}
            print(f"  sync {name}: skipped, {out[name]['status']}", flush=True)
            continue
        folder = work / f"sync_{name}"
        folder.mkdir(parents=True, exist_ok=True)
        spec = {
            "config": str(config_path),
            "sets": [*sets, *chosen, lora, f"rollout.engine={ENGINES[name]}"],
            "model_dir": str(work / "model"),
            "rollout": name,
            "trainer": args.sync_trainer,
            "rounds": args.rounds,
            "warmup": args.sync_warmup,
        }
        (folder / "spec.json").write_text(json.dumps(spec))
        result_path = folder / "result.json"
        result_path.unlink(missing_ok=True)
        measured = run_measured(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--sync-worker",
                str(folder / "spec.json"),
                str(result_path),
            ],
            folder / "worker.log",
        )
        if measured.returncode == 0 and result_path.is_file():
            out[name] = {"status": "ok", "log": str(measured.log), **json.loads(result_path.read_text())}
            print(f"  sync {name}: done in {measured.seconds:.0f} s", flush=True)
        else:
            out[name] = {"status": f"failed (exit {measured.returncode})", "log": str(measured.log)}
            print(f"  sync {name}: FAILED, log {measured.log}:\n{log_tail(measured.log)}", flush=True)
    out["_settings"] = {"trainer": args.sync_trainer, "trainer_spec": describe_spec(chosen), "note": note}
    return out


def sync_table(sync: dict[str, Any]) -> list[str]:
    labels = {"full": "full weights (full FT)", "merged": "merged weights (LoRA)", "adapter": "adapters (LoRA)"}
    prepares = {"full": "named_weights()", "merged": "merge: named_weights()", "adapter": "adapter()"}
    lines = [
        f"{'rollout':<8}{'path':<24}{'ms/sync':>9}{'prepare ms':>11}{'sync ms':>9}{'MB sent':>9}"
        f"{'x full':>8}{'sync x full':>12}  runs on"
    ]
    for name, r in sync.items():
        if name.startswith("_"):
            continue
        if r["status"] != "ok":
            lines.append(f"{name:<8}{r['status']}" + (f" (log {r['log']})" if "log" in r else ""))
            continue
        full = r["paths"].get("full", {})
        for path in PATHS:
            p = r["paths"].get(path, {})
            if "unsupported" in p:
                lines.append(f"{name:<8}{labels[path]:<24}  not supported by this build: {p['unsupported']}")
                continue
            if "error" in p:
                lines.append(f"{name:<8}{labels[path]:<24}  failed: {p['error']} (log {r['log']})")
                continue
            ratio = p["total_ms"] / full["total_ms"] if "total_ms" in full else None
            sync_ratio = p["sync_ms"] / full["sync_ms"] if "sync_ms" in full else None
            lines.append(
                f"{name:<8}{labels[path]:<24}{p['total_ms']:>9.2f}{p['prepare_ms']:>11.2f}{p['sync_ms']:>9.2f}"
                f"{p['bytes'] / 2**20:>9.2f}{fmt(ratio, '.3f'):>8}{fmt(sync_ratio, '.3f'):>12}  {p['runs_on']}"
            )
    settings = sync["_settings"]
    lines += [
        f"training engine for the sync: {settings['trainer']} {settings['trainer_spec']}"
        + (f" ({settings['note']})" if settings["note"] else ""),
        "ms/sync: median of prepare + sync per round; prepare: "
        + ", ".join(f"{labels[k]}: {v}" for k, v in prepares.items())
        + "; sync: sync_weights() / sync_adapter(); MB sent: the tensors handed to the rollout engine;",
        "x full: ms/sync over the full path's; sync x full: the sync call alone over the full path's sync call",
    ]
    return lines


# -- the driver -------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--scale", choices=["tiny", "long"], default="long", help="examples/bench/<scale>.yaml (default long)"
    )
    lora = parser.add_argument_group("the adapters (model.lora)")
    lora.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    lora.add_argument("--alpha", type=float, default=16.0, help="LoRA alpha (default 16)")
    lora.add_argument(
        "--targets", default=DEFAULT_TARGETS, help=f"target_modules, comma-separated (default {DEFAULT_TARGETS})"
    )
    memory = parser.add_argument_group("1. memory of a training step")
    memory.add_argument(
        "--engines", default="torch,deepspeed", help="training engines, comma-separated (default torch,deepspeed)"
    )
    memory.add_argument("--length", type=int, default=256, help="response length (max_new_tokens; default 256)")
    memory.add_argument("--prompts", type=int, default=4, help="prompts in the rollout batch (default 4)")
    memory.add_argument("--group-size", type=int, default=8, help="responses per prompt (default 8)")
    memory.add_argument(
        "--budget", type=int, default=2048, metavar="TOKENS", help="trainer.max_tokens_per_micro_batch (default 2048)"
    )
    memory.add_argument("--warmup", type=int, default=1, help="steps before the timed ones (default 1)")
    memory.add_argument("--repeats", type=int, default=1, help="timed steps; the median is reported (default 1)")
    memory.add_argument(
        "--max-updates",
        type=int,
        default=0,
        metavar="N",
        help="run only the first N minibatch updates per step (default: all)",
    )
    memory.add_argument("--skip-memory", action="store_true", help="measure the sync only")
    sync = parser.add_argument_group("2. weight sync")
    sync.add_argument(
        "--rollouts", default=None, help="rollout engines, comma-separated (default: vllm if it imports, hf)"
    )
    sync.add_argument(
        "--sync-trainer",
        choices=TRAINERS,
        default="torch",
        help="training engine that gives the weights (default torch)",
    )
    sync.add_argument(
        "--rounds", type=int, default=10, help="timed rounds per path; the median is reported (default 10)"
    )
    sync.add_argument("--sync-warmup", type=int, default=2, help="rounds dropped at the start (default 2)")
    sync.add_argument("--skip-sync", action="store_true", help="measure the memory only")
    parser.add_argument("--out", help="folder for lora_<scale>.json / .txt")
    parser.add_argument("--work", help="folder for the model and the workers' logs (default: a new temporary folder)")
    parser.add_argument("--sync-worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sync_worker:  # everything it needs is in its spec
        return args
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.rollouts = (
        [r.strip() for r in args.rollouts.split(",") if r.strip()]
        if args.rollouts is not None
        else [r for r in ROLLOUTS if r != "vllm" or available("vllm")]
    )
    if unknown := [e for e in args.engines if e not in TRAINERS]:
        parser.error(f"--engines: {unknown}; choose from {TRAINERS}")
    if unknown := [r for r in args.rollouts if r not in ROLLOUTS]:
        parser.error(f"--rollouts: {unknown}; choose from {ROLLOUTS}")
    if not args.targets or args.rank < 1 or args.length < 1 or args.prompts < 1 or args.group_size < 1:
        parser.error("need --targets, and positive --rank, --length, --prompts, --group-size")
    if args.warmup < 0 or args.repeats < 1 or args.rounds < 1 or args.sync_warmup < 0 or args.max_updates < 0:
        parser.error("need --warmup >= 0, --repeats >= 1, --rounds >= 1, --sync-warmup >= 0, --max-updates >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sync_worker:
        spec_path, result_path = args.sync_worker
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        Path(result_path).write_text(json.dumps(sync_worker(json.loads(Path(spec_path).read_text()))))
        return 0

    import torch

    from rlzoo.config.resolution import load_config
    from rlzoo.models import build_char_tokenizer
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import make_task

    config_path = ROOT / "examples" / "bench" / f"{args.scale}.yaml"
    sets: list[str] = []
    config = load_config(config_path)
    # room for the longest prompt plus the longest response in the model's positions (as memory_scaling.py)
    tokenizer = build_char_tokenizer(make_task(config, default_registry()).alphabet())
    longest = max(len(p) for p in prompt_pool(config, tokenizer, args.prompts)) + args.length
    if longest > config.model.tiny.max_position_embeddings:
        sets.append(f"model.tiny.max_position_embeddings={longest}")
        config = load_config(config_path, sets)
    load_config(config_path, [*sets, lora_set(args)])  # the adapters' settings validate before anything runs

    work = Path(args.work or tempfile.mkdtemp(prefix="rlzoo-lora-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"# lora: {args.scale}; work folder {work}", flush=True)
    model = build_model(config, work / "model")
    print(f"# model: {model['description']}", flush=True)
    memory = None if args.skip_memory else run_memory(args, config, config_path, sets, work)
    sync = None if args.skip_sync else run_sync(args, config_path, sets, work)
    machine["load_after"] = [round(x, 2) for x in os.getloadavg()]

    lines = [
        f"# lora: {args.scale}: {model['description']}",
        f"# adapters: rank {args.rank}, alpha {args.alpha:g}, targets {', '.join(args.targets)}",
        f"# {machine['date']}, {machine['platform']}, {machine['cpus']} CPUs, torch {machine['torch']}, "
        f"load {machine['load_before']} -> {machine['load_after']}",
    ]
    if memory is not None:
        lines += [
            "",
            f"## memory of one training step: {args.prompts} prompts x {args.group_size} responses, length "
            f"{args.length} (uniform in [length/2, length]), budget {args.budget} tokens, {config.algorithm.minibatches_per_rollout} "
            f"minibatches, {args.warmup} warm-up step(s), median of {args.repeats}",
            *memory_table(memory, args),
        ]
    if sync is not None:
        lines += [
            "",
            f"## weight sync: median of {args.rounds} rounds after {args.sync_warmup} dropped",
            *sync_table(sync),
        ]
    table = "\n".join(lines)
    print(table, flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = {
            "scale": args.scale,
            "model": model,
            "machine": machine,
            "settings": {k: v for k, v in vars(args).items() if k not in {"out", "work", "sync_worker"}},
            "sets": sets,
            "memory": memory,
            "sync": sync,
            "seconds": time.perf_counter() - started,
        }
        (out / f"lora_{args.scale}.json").write_text(json.dumps(result, indent=2))
        (out / f"lora_{args.scale}.txt").write_text(table + "\n")
        print(f"written: {out / f'lora_{args.scale}.json'}, .txt", flush=True)
    failed = memory is not None and any(r[k]["status"] != "ok" for r in memory.values() for k in ("full", "lora"))
    failed |= sync is not None and any(
        r.get("status", "ok") != "ok"
        for k, r in sync.items()
        if not k.startswith("_") and r.get("status") != "vllm does not import here (benchmarks/_common.available)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
