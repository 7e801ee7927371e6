"""Fixed-seed ``rlzoo train`` runs of a checkout, for a refactor's proof (docs/contributing.md, "Habits"): run them on
the commit before and after, then compare the folders with ``scripts/compare_metrics.py``.

    python scripts/fixed_seed_runs.py OUT [--repo CHECKOUT] [--cold DIR] [--only NAME ...]
    python scripts/compare_metrics.py OUT_BEFORE OUT_AFTER

Each run is the integration tests' fast main job (``integration_tests/fast_job.py`` ``FAST`` on
``examples/gspo_tiny_moe.yaml``, hf rollouts and torch training) with a variant's overrides: ``main`` as is, ``ppo``
and ``lora`` as ``integration_tests/test_resume.py`` sets them, ``correction`` a rejection correction with importance
weights (its reports in both the old pass and the loss mask), ``overlap`` (``rollout.overlap: 1``, the batch sampled
in a background thread) and ``tools`` (``examples/tools_calculator.yaml``, multi-turn episodes with a tool, the same
fast settings); the ``*-dense`` ones again with a reward most responses earn (the fast cold start's model gets no
answer right, so the others train on rewards that are mostly 0). ``CHECKOUT`` (default: this one) is the code that runs, from its own folders on ``PYTHONPATH``;
``--cold`` shares the cold starts between the before and after runs (built by the first that needs one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration_tests"))  # a folder of plain modules, not a package

from fast_job import FAST  # noqa: E402 - the integration tests' folder on the path first

PPO = ["algorithm.preset=ppo", "algorithm.kl_in_reward={name: adaptive, coef: 0.05, target: 0.01, horizon: 100}"]
LORA = [
    "model.lora={rank: 4, alpha: 16, target_modules: [q_proj, v_proj, o_proj, experts.down_proj]}",
    "trainer.lr=0.001",
    "algorithm.kl_coef=0.01",
]
CORRECTION = [
    "algorithm.correction={name: rejection, criteria: [{statistic: k3, level: seq_max, high: 0.01}], "
    "importance: {threshold: 1.5, normalize: true}}"
]
#: a reward most responses earn and some miss (the fast cold start's model answers no sum right): advantages, losses
#: and the critic's values that are not all zero
DENSE = ["verifier={name: regex, pattern: '[0-9]+', fullmatch: false}"]
#: name -> (example, task of its cold start, overrides)
RUNS = {
    "main": ("gspo_tiny_moe.yaml", "arithmetic", []),
    "ppo": ("gspo_tiny_moe.yaml", "arithmetic", PPO),
    "lora": ("gspo_tiny_moe.yaml", "arithmetic", LORA),
    "correction": ("gspo_tiny_moe.yaml", "arithmetic", CORRECTION),
    "overlap": ("gspo_tiny_moe.yaml", "arithmetic", ["rollout.overlap=1", *CORRECTION]),
    "tools": ("tools_calculator.yaml", "calculator", []),
    "dense": ("gspo_tiny_moe.yaml", "arithmetic", [*DENSE, *CORRECTION, "train.steps=4"]),
    "ppo-dense": ("gspo_tiny_moe.yaml", "arithmetic", [*PPO, *DENSE]),
    "lora-dense": ("gspo_tiny_moe.yaml", "arithmetic", [*LORA, *DENSE]),
    "tools-dense": ("tools_calculator.yaml", "calculator", DENSE),
}
PATHS = (".", "estimators", "verifiers", "plugins/tasks", "plugins/routing", "plugins/tools", "plugins/loggers")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repo", type=Path, default=ROOT)
    parser.add_argument("--cold", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=list(RUNS))
    args = parser.parse_args(argv)
    repo, out = args.repo.resolve(), args.out.resolve()
    cold = (args.cold or out / "cold").resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(repo / p) for p in PATHS)}
    failed = 0
    for name in args.only:
        example, task, overrides = RUNS[name]
        sets = [*FAST, *overrides, f"output_dir={out / name}", f"cold_start.output_dir={cold / task}"]
        cmd = [sys.executable, "-m", "rlzoo.cli", "train", str(repo / "examples" / example)]
        cmd += [arg for value in sets for arg in ("--set", value)]
        start = time.time()
        done = subprocess.run(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        print(f"{name}: exit {done.returncode} in {time.time() - start:.0f} s", flush=True)
        if done.returncode:
            print(done.stderr[-3000:], flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
