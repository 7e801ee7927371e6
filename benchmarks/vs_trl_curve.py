"""rlzoo against TRL as a curve over the completion length: ``vs_trl.py`` once per ``rollout.max_new_tokens``.

    python benchmarks/vs_trl_curve.py --scale long|real|tiny [--lengths 64,128,256,512]
                                      [--systems vllm+deepspeed,vllm+torch,trl] [--steps N] [--warmup W]
                                      [--repeats R] [--set k=v ...] [--eval] [--work DIR] [--out DIR]
    python benchmarks/vs_trl_curve.py --replot curve_<scale>.json [--out DIR]

Why a curve: the speed ratio against TRL depends on how long the answers are (a short step is dominated by fixed
costs: process start-up per step, weight sync, Python glue; a long one by sampling and the update). One point
(the docs' 1.85x at 256 tokens, an independent 0.96x at 128) says little about another.

Each length is one ``benchmarks/vs_trl.py`` invocation in its own process with ``--set
rollout.max_new_tokens=L`` and the rest of the options as given, all starting from ONE model folder: the cold start
the first length builds (``--scale tiny|long``; the model's ``max_position_embeddings`` is raised beforehand, for
every length alike, when the longest prompt plus the longest length does not fit), or the config's ``model.path``
(``--scale real``: SmolLM2-135M-Instruct). Same prompts in the same order, same group size, minibatches and
sampling for every system at every length. ``--lengths`` beyond what the task's answers need are cut short by the
model's end of turn, not by the limit: the table gives the generated tokens per step beside each point, so a point
where the answers stopped growing reads as such.

Prints one row per length and system (s/step, generated tokens per step, ratio to TRL's steps per second, the
phases), and with ``--out DIR`` writes ``curve_<scale>.json`` (every invocation's full result), ``.txt`` (the
table) and ``.png`` (speed against TRL and s/step over the length, one line per system). Measured numbers belong in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from vs_trl import DEFAULT_STEPS, SCALES, fmt

HERE = Path(__file__).resolve().parent
DEFAULT_SYSTEMS = "vllm+deepspeed,vllm+torch,trl"


def position_sets(config_path: str, sets: list[str], longest_length: int) -> list[str]:
    """``--set`` raising a built model's ``max_position_embeddings`` to the longest prompt + ``longest_length``
    (none for a pretrained ``model.path``, whose positions are its own)."""
    from rlzoo.config.resolution import load_config
    from rlzoo.episodes.prompts import prompt_ids
    from rlzoo.models import build_char_tokenizer
    from rlzoo.registry import default_registry
    from rlzoo.runtime.assembly import make_task

    config = load_config(config_path, sets)
    if config.model.path:
        return []
    task = make_task(config, default_registry())
    tokenizer = build_char_tokenizer(task.alphabet())
    prompt = max(len(prompt_ids(tokenizer, s, config.prompt)) for s in task.samples("train", None, config.seed))
    needed = prompt + longest_length
    if needed <= config.model.tiny.max_position_embeddings:
        return []
    return [f"model.tiny.max_position_embeddings={needed}"]


class _Read(BaseModel):
    model_config = ConfigDict(extra="allow")  # the files hold more than the table and plot read


class _System(_Read):
    """One system's result at one length (vs_trl.py's ``systems.<name>``): what :func:`rows` reads when it is ok."""

    status: str
    step_s: float | None = None
    tokens_per_step: float | None = None
    tokens_per_s: float | None = None
    phases_s: dict[str, float] | None = None
    peak_tree_rss_mb: float | None = None
    peak_process_rss_mb: float | None = None

    @model_validator(mode="after")
    def _ok_has_numbers(self) -> _System:
        if self.status == "ok":
            for field in ("step_s", "tokens_per_step", "tokens_per_s", "phases_s"):
                if getattr(self, field) is None:
                    raise ValueError(f"an ok system needs {field}")
        return self


class _Batch(_Read):
    prompts: int = Field(ge=1)
    group_size: int = Field(ge=1)


class _Point(_Read):
    """One length's vs_trl.py result (or its failure: ``status`` and ``log`` only)."""

    status: str
    log: str
    batch: _Batch | None = None
    systems: dict[str, _System] | None = None
    derived: dict[str, dict[str, float | None]] = {}

    @model_validator(mode="after")
    def _ok_has_systems(self) -> _Point:
        if self.status == "ok" and (not self.systems or self.batch is None):
            raise ValueError("an ok point needs its batch and at least one system")
        return self


class _Curve(_Read):
    """A ``curve_<scale>.json``, as far as ``--replot`` reads it: checked whole before anything is used."""

    scale: str
    model: str
    batch: str
    date: str
    steps: int
    warmup: int
    repeats: int
    cpus: int
    seconds: float
    load_before: list[float]
    load_after: list[float]
    lengths: list[int] = Field(min_length=1)
    points: dict[int, _Point] = Field(min_length=1)


def read_curve(path: Path) -> dict[str, Any]:
    """The curve in ``path``, its shape checked (:class:`_Curve`); a :class:`ValueError` saying what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(error.strerror or str(error)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not JSON: {error}") from None
    try:
        _Curve.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        raise ValueError(f"{where}: {first['msg'].removeprefix('Value error, ')}{more}") from None
    data["points"] = {int(length): point for length, point in data["points"].items()}
    return data


def run_point(args: argparse.Namespace, length: int, sets: list[str], cold_start: Path | None) -> dict[str, Any]:
    """One ``vs_trl.py`` invocation at ``rollout.max_new_tokens = length``; its JSON result (or the failure)."""
    work = Path(args.work) / f"len{length}"
    work.mkdir(parents=True, exist_ok=True)
    out = work / "result.json"
    out.unlink(missing_ok=True)
    command = [
        sys.executable,
        str(HERE / "vs_trl.py"),
        "--scale",
        args.scale,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--repeats",
        str(args.repeats),
        "--systems",
        args.systems,
        "--work",
        str(work),
        "--json",
        str(out),
        "--figure",
        str(work / "phases.png"),
        *([] if args.eval else ["--skip-eval"]),
        *[item for s in [*sets, f"rollout.max_new_tokens={length}"] for item in ("--set", s)],
        *(["--config", args.config] if args.config else []),
        *(["--cold-start", str(cold_start)] if cold_start else []),
    ]
    log = work / "vs_trl.log"
    with log.open("w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode != 0 or not out.is_file():
        return {"status": f"failed (exit {done.returncode})", "log": str(log)}
    return {"status": "ok", "log": str(log), **json.loads(out.read_text())}


def rows(points: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (length, system) from the invocations' results."""
    table = []
    for length, point in sorted(points.items()):
        if point["status"] != "ok":
            table.append({"length": length, "system": "-", "status": point["status"], "log": point["log"]})
            continue
        trl = point["systems"].get("trl", {})
        for name, s in point["systems"].items():
            row = {"length": length, "system": name, "status": s["status"]}
            if s["status"] == "ok":
                responses = point["batch"]["prompts"] * point["batch"]["group_size"]
                row.update(
                    step_s=s["step_s"],
                    tokens_per_step=s["tokens_per_step"],
                    tokens_per_response=s["tokens_per_step"] / responses if s["tokens_per_step"] else None,
                    speed_vs_trl=point["derived"].get(name, {}).get("speed_vs_trl"),
                    # per generated token: fair where the systems' sampled answers differ in length
                    tokens_vs_trl=s["tokens_per_s"] / trl["tokens_per_s"]
                    if name != "trl" and trl.get("status") == "ok" and trl.get("tokens_per_s")
                    else None,
                    phases_s=s["phases_s"],
                    peak_mb=s["peak_tree_rss_mb"] or s["peak_process_rss_mb"],
                    accuracy=[s.get("eval_accuracy_before"), s.get("eval_accuracy_after")],
                )
            table.append(row)
    return table


def report(result: dict[str, Any]) -> str:
    lines = [
        f"# {result['scale']} ({result['model']}): {result['batch']}; {result['steps']} steps, "
        f"{result['warmup']} warm-up, {result['repeats']} repeat(s); {result['date']}, {result['cpus']} CPUs, "
        f"load before {result['load_before']}, after {result['load_after']}",
        f"{'max tokens':>10}  {'system':<34}{'s/step':>8}{'tok/resp':>9}{'vs TRL':>8}{'tok/s vs':>9}{'rollout':>9}{'old':>8}"
        f"{'train':>8}{'sync':>7}{'peak MB':>9}",
    ]
    for row in result["rows"]:
        if row["status"] != "ok":
            lines.append(f"{row['length']:>10}  {row['system']:<34}{row['status']} (log {row.get('log', '-')})")
            continue
        p = row["phases_s"]
        lines.append(
            f"{row['length']:>10}  {row['system']:<34}{fmt(row['step_s'], '.2f'):>8}{fmt(row['tokens_per_response'], '.0f'):>9}"
            f"{fmt(row['speed_vs_trl'], '.2f'):>8}{fmt(row['tokens_vs_trl'], '.2f'):>9}{fmt(p.get('rollout'), '.2f'):>9}{fmt(p.get('old_logprobs'), '.2f'):>8}"
            f"{fmt(p.get('train'), '.2f'):>8}{fmt(p.get('sync'), '.2f'):>7}{fmt(row['peak_mb'], '.0f'):>9}"
        )
    lines.append(
        "s/step: median wall seconds per step after warm-up; tok/resp: mean generated tokens per response; "
        "vs TRL: TRL's s/step over the system's (> 1: rlzoo faster); tok/s vs: generated tokens per second over TRL's "
        "(the same, per token: fairer where the answers sampled differ in length); phases: medians (TRL has none but its "
        f"reward); whole curve {result['seconds']:.0f} s"
    )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ratio_ax, step_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    ok = [r for r in result["rows"] if r["status"] == "ok"]
    for index, name in enumerate(dict.fromkeys(r["system"] for r in ok)):
        mine, color = [r for r in ok if r["system"] == name], f"C{index}"
        step_ax.plot([r["length"] for r in mine], [r["step_s"] for r in mine], marker="o", color=color, label=name)
        ratios = [r for r in mine if r.get("speed_vs_trl")]
        if ratios:
            lengths = [r["length"] for r in ratios]
            ratio_ax.plot(
                lengths, [r["speed_vs_trl"] for r in ratios], marker="o", color=color, label=f"{name}: per step"
            )
            ratio_ax.plot(
                lengths,
                [r["tokens_vs_trl"] for r in ratios],
                marker="x",
                linestyle="--",
                color=color,
                alpha=0.7,
                label=f"{name}: per generated token",
            )
    ratio_ax.axhline(1.0, color="0.5", linestyle="--", linewidth=1)
    for ax, label in ((ratio_ax, "speed vs TRL (> 1: rlzoo faster)"), (step_ax, "median s/step")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(result["lengths"], [str(x) for x in result["lengths"]])
        ax.set_xlabel("rollout.max_new_tokens")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['scale']}: {result['model']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="long")
    parser.add_argument("--config", help="another run config (default: examples/bench/<scale>.yaml)")
    parser.add_argument(
        "--lengths", default="64,128,256,512", help="rollout.max_new_tokens values (default 64,128,256,512)"
    )
    parser.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"vs_trl.py systems (default {DEFAULT_SYSTEMS})")
    parser.add_argument("--steps", type=int, help="rollouts per run (default: vs_trl.py's for the scale)")
    parser.add_argument("--warmup", type=int, help="steps dropped at the start of each run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per system and length (default 1)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override the config (repeatable)"
    )
    parser.add_argument(
        "--eval",
        action="store_true",
        help="run vs_trl.py's held-out evaluation at every length "
        "(default: speed only; the accuracy columns stay empty)",
    )
    parser.add_argument("--work", help="folder for every invocation (default: a new temporary folder)")
    parser.add_argument("--out", help="write curve_<scale>.json, .txt and .png here")
    parser.add_argument(
        "--replot",
        metavar="JSON",
        help="run nothing: remake the table (and with --out the files) from an earlier curve_<scale>.json",
    )
    args = parser.parse_args(argv)
    try:
        args.lengths = sorted({int(x) for x in args.lengths.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--lengths takes comma-separated integers, not {args.lengths!r}")
    if not args.lengths or args.lengths[0] < 1:
        parser.error("--lengths needs positive integers")
    steps, warmup = DEFAULT_STEPS[args.scale]
    args.steps = steps if args.steps is None else args.steps
    args.warmup = warmup if args.warmup is None else args.warmup
    if not 1 <= args.warmup < args.steps:
        parser.error("need 1 <= --warmup < --steps")
    return args


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args = parse_args(argv)
    if args.replot:
        try:
            result = read_curve(Path(args.replot))
        except ValueError as error:
            print(f"vs_trl_curve.py: --replot {args.replot}: not a curve_<scale>.json ({error})", file=sys.stderr)
            return 1
        result["rows"] = rows(result["points"])
        return write(result, args.out)
    args.work = str(Path(args.work or tempfile.mkdtemp(prefix="rlzoo-vs-trl-curve-")).resolve())
    config_path = str(args.config or SCALES[args.scale])
    sets = [*args.set, *position_sets(config_path, args.set, max(args.lengths))]
    started = time.time()
    load_before = [round(x, 2) for x in os.getloadavg()]
    print(f"# {args.scale}: lengths {args.lengths}, systems {args.systems}; work folder {args.work}", flush=True)
    points: dict[int, dict[str, Any]] = {}
    cold_start: Path | None = None
    for length in args.lengths:
        print(f"max_new_tokens {length} ...", flush=True)
        points[length] = point = run_point(args, length, sets, cold_start)
        if point["status"] != "ok":
            print(f"  {point['status']}, log {point['log']}", flush=True)
            continue
        cold_start = cold_start or Path(point["cold_start"]["path"])  # the first length's serves the rest
        for name, s in point["systems"].items():
            ratio = point["derived"].get(name, {}).get("speed_vs_trl")
            print(
                f"  {name}: {fmt(s.get('step_s'), '.2f')} s/step, vs TRL {fmt(ratio, '.2f')}"
                if s["status"] == "ok"
                else f"  {name}: {s['status']}",
                flush=True,
            )
    first = next((p for p in points.values() if p["status"] == "ok"), None)
    result = {
        "scale": args.scale,
        "config": config_path,
        "sets": sets,
        "lengths": args.lengths,
        "systems": args.systems,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "model": first["model"]["description"] if first else "-",
        "batch": first["batch"]["description"].rsplit(",", 1)[0] if first else "-",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "rows": rows(points),
        "points": points,
        "seconds": time.time() - started,
    }
    write(result, args.out)
    return 0 if all(p["status"] == "ok" for p in points.values()) else 1


def write(result: dict[str, Any], out_dir: str | None) -> int:
    """Print the table; with ``out_dir`` write curve_<scale>.json, .txt and .png there."""
    table = report(result)
    print(table, flush=True)
    if out_dir:
        out, stem = Path(out_dir), f"curve_{result['scale']}"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
        (out / f"{stem}.txt").write_text(table + "\n")
        plot(result, out / f"{stem}.png")
        print(f"written: {out / stem}.json, .txt, .png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
