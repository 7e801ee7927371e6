"""Which task can tell algorithms apart? SmolLM2's starting accuracy on candidate tasks, sampled as training samples.

For each candidate (a ``task`` block put into ``results/smollm2.yaml``), the starting model answers ``--prompts``
held-out prompts ``--samples`` times each at the config's training temperature (1.0), through rlzoo's own
set-up (the config's prompt format, vLLM engine and verifier), and the probe reports:

    accuracy        share of responses the task's verifier counts correct
    format          share of responses that are a bare number, right or wrong (the system prompt's format:
                    "Reply with the final number only") -- a task where accuracy only tracks this is a format task
    tokens          mean response length in tokens
    truncated       share of responses that hit max_new_tokens

A task suits the results table when its starting accuracy is 0.1-0.4 and well below its format share (there is
something to learn beyond the format). Each candidate runs in its own process (a fresh vLLM engine); the table is
written to ``results/probe.json`` and ``results/probe.md`` (included by ``docs/results.md``).

    python results/probe_tasks.py [--prompts 100] [--samples 4]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE_CONFIG = HERE / "smollm2.yaml"

#: name -> the config's ``task`` (and ``verifier``) blocks for the candidate
CALCULATOR = "You are a calculator. Reply with the result only, as a number. Example: 2+3= -> 5"
CANDIDATES: dict[str, dict] = {
    "arithmetic 1-digit +, calculator prompt": {
        "task": {"name": "arithmetic", "digits": 1, "operations": ["+"]},
        "prompt": {"plain": "chat", "system": CALCULATOR},
    },
    "arithmetic 1-digit +*, calculator prompt": {
        "task": {"name": "arithmetic", "digits": 1, "operations": ["+", "*"]},
        "prompt": {"plain": "chat", "system": CALCULATOR},
    },
    "arithmetic 1-digit +": {"task": {"name": "arithmetic", "digits": 1, "operations": ["+"]}},
    "arithmetic 1-digit +*": {"task": {"name": "arithmetic", "digits": 1, "operations": ["+", "*"]}},
    "arithmetic 2-digit +": {"task": {"name": "arithmetic", "digits": 2, "operations": ["+"]}},
    "chain 3 terms (final total)": {
        "task": {"name": "chain", "terms": 3, "max_operand": 9},
        "verifier": {"name": "math"},
    },
    "arithmetic 1-digit +, no chat template": {
        "task": {"name": "arithmetic", "digits": 1, "operations": ["+"]},
        "prompt": {"plain": "text"},
    },
}

BARE_NUMBER = re.compile(r"^\s*-?\d+(\.\d+)?\s*\.?\s*$")


def measure_one(candidate: str, prompts: int, samples: int) -> dict:
    """One candidate in this process: the run's set-up (no training), then one sampled pass over held-out prompts."""
    import yaml

    from rlzoo.config.resolution import build_config
    from rlzoo.engines.base import SamplingSettings
    from rlzoo.registry import default_registry
    from rlzoo.runtime.run import TrainingRun
    from rlzoo.util.decode import response_text

    data = yaml.safe_load(BASE_CONFIG.read_text())
    data.update(CANDIDATES[candidate])
    registry = default_registry()
    with tempfile.TemporaryDirectory(prefix="rlzoo-probe-") as out:
        data["output_dir"] = out
        config = build_config(data, registry=registry, source=str(BASE_CONFIG))
        run = TrainingRun(config, registry, progress=False)
        run.setup()
        try:
            held_out = run.eval_set[:prompts]
            sampling = SamplingSettings(
                n=samples,
                max_new_tokens=config.rollout.max_new_tokens,
                temperature=config.rollout.temperature,
                top_p=1.0,
                seed=12345,
            )
            ran = run.episodes.run(run.rollout, held_out, sampling, config.prompt)
            generations = [g for group in ran.groups for g in group]
            repeated = [s for s, group in zip(held_out, ran.groups, strict=True) for _ in group]
            texts = [response_text(run.tokenizer, g.last_turn_ids) for g in generations]
            verdicts = run.verifier.verify_batch(repeated, texts)
        finally:
            run.rollout.close()
            if run.folder_lock is not None:
                run.folder_lock.release()
    lengths = [len(g.last_turn_ids) for g in generations]
    n = len(generations)
    return {
        "candidate": candidate,
        "task": CANDIDATES[candidate]["task"],
        "prompt": config.prompt.model_dump(include={"plain", "system"}),
        "requested": [prompts, samples],  # prompts (at most the held-out pool) x samples
        "responses": n,
        "accuracy": sum(bool(v.correct) for v in verdicts) / n,
        "format": sum(bool(BARE_NUMBER.match(t)) for t in texts) / n,
        "tokens": sum(lengths) / n,
        "truncated": sum(x >= config.rollout.max_new_tokens for x in lengths) / n,
        "examples": [
            {"prompt": s.prompt, "answer": s.answer, "response": t} for s, t in list(zip(repeated, texts))[:6]
        ],
    }


def markdown(rows: list[dict], prompts: int, samples: int) -> str:
    held_out = sorted({r["responses"] // samples for r in rows})
    lines = [
        f"Starting model, {' or '.join(map(str, held_out))} held-out prompts (at most `--prompts {prompts}`: the "
        f"config's held-out pool) x {samples} samples at temperature 1.0 "
        f"(`python results/probe_tasks.py --prompts {prompts} --samples {samples}`):",
        "",
        "| candidate task | accuracy (± binomial 95%) | format (bare number) | tokens / response | truncated |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['candidate']} | {r['accuracy']:.3f} ± {1.96 * math.sqrt(r['accuracy'] * (1 - r['accuracy']) / r['responses']):.3f}"
            f" | {r['format']:.3f} | {r['tokens']:.1f} | {r['truncated']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=100)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--one", help=argparse.SUPPRESS)  # a single candidate, in a child process: JSON on stdout
    args = p.parse_args()
    if args.one:
        print("PROBE " + json.dumps(measure_one(args.one, args.prompts, args.samples)))
        return 0
    cache = HERE / "probe.json"  # measured candidates are kept: a rerun measures only the others
    done = {r["candidate"]: r for r in json.loads(cache.read_text())} if cache.is_file() else {}
    rows = []
    for candidate in CANDIDATES:
        if candidate in done and done[candidate].get("requested") == [args.prompts, args.samples]:
            rows.append(done[candidate])
            continue
        cmd = [sys.executable, __file__, "--one", candidate, "--prompts", str(args.prompts)]
        child = subprocess.run([*cmd, "--samples", str(args.samples)], capture_output=True, text=True)
        line = next((x for x in child.stdout.splitlines() if x.startswith("PROBE ")), None)
        if child.returncode != 0 or line is None:
            print(f"{candidate}: failed\n{child.stderr[-3000:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(line[len("PROBE ") :]))
        r = rows[-1]
        print(f"{candidate:42s} accuracy {r['accuracy']:.3f}  format {r['format']:.3f}  tokens {r['tokens']:.1f}")
        cache.write_text(json.dumps(list({**done, **{x["candidate"]: x for x in rows}}.values()), indent=1) + "\n")
    (HERE / "probe.md").write_text(markdown(rows, args.prompts, args.samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
