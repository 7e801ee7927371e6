"""The tiny main job's fast overrides (``FAST``): the end-to-end tests' runs and ``scripts/fixed_seed_runs.py``'s
runs are the same job, so the list lives once, here.

A module of its own, importing nothing: ``runs_testlib`` (which the tests import it through) loads rlzoo and torch,
while ``scripts/fixed_seed_runs.py`` only starts ``rlzoo train`` of a checkout in subprocesses and needs no more of
this folder than the list.
"""

from __future__ import annotations

# small enough for CI: a 2-layer MoE, a few SFT steps, a few RL steps with 4 prompts x 4 responses, on the
# in-process engines (tests of vLLM and DeepSpeed select them explicitly)
FAST = [
    "rollout.engine={name: hf}",
    "trainer.engine={name: torch}",
    "cold_start.steps=40",
    "cold_start.batch_size=16",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "train.steps=3",
    "train.eval_every=2",
    "train.eval_prompts=16",
    "train.checkpoint_every=2",
]
