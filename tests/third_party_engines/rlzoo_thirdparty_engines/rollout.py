"""``relay-rollout``: transformers generate, each group sampled in ``lanes`` calls of ``n / lanes`` responses.

Its check rule: ``lanes`` must divide ``rollout.group_size`` (reported at ``rollout.engine.lanes``, naming the
divisors). It keeps ``hf``'s ``can_record_routing``, so Rollout Routing Replay works through it too. It reports the
generate calls it made in lanes (``rollout_engine/relay-rollout/lane_calls``, a ``Sum`` over the step's
generation batches) and its weight syncs (``rollout_engine/relay-rollout/syncs``).
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from rlzoo.engines import Generation, HFRolloutEngine, SamplingSettings
from rlzoo.interfaces import Problem, RunFacts, Sum


class RelayRolloutEngine(HFRolloutEngine):
    """transformers generate() in lanes: each group of n responses sampled as `lanes` calls of n / lanes."""

    name = "relay-rollout"

    class Params(HFRolloutEngine.Params):
        lanes: int = Field(1, ge=1, description="calls each group is sampled in; must divide rollout.group_size")

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        problems = list(super().preflight(run, at))
        group, lanes = run.config.rollout.group_size, self.params.lanes
        if group % lanes:
            divisors = [d for d in range(1, group + 1) if group % d == 0]
            message = f"{lanes} does not divide rollout.group_size {group}; use one of {divisors}"
            problems.append((f"{at}.lanes", message))
        return problems

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Generation]]:
        lanes = self.params.lanes
        if lanes == 1 or sampling.n % lanes:  # e.g. evaluation's samples per prompt: one lane
            return super().generate(prompts, sampling)
        out: list[list[Generation]] = [[] for _ in prompts]
        self.report("lane_calls", Sum(float(lanes)))
        for lane in range(lanes):
            seed = None if sampling.seed is None else sampling.seed + lane
            lane_sampling = replace(sampling, n=sampling.n // lanes, seed=seed)
            for group, generations in zip(out, super().generate(prompts, lane_sampling)):
                group.extend(generations)
        return out

    def sync_weights(self, named_tensors) -> None:
        super().sync_weights(named_tensors)
        self.report("syncs", Sum(1.0))
