"""Train/eval splits for synthetic generators.

The eval split is a fixed pool of distinct problems drawn from a private, seed-independent RNG (so every run
evaluates on the same problems); it holds ``eval_size`` problems, at most a fifth of all possible ones. Train
samples are drawn with the caller's seed and every problem in the eval pool is rejected, so the two splits are
disjoint for any pair of seeds. Within one ``samples`` call train problems are distinct while the generator
still finds new ones; repeats only appear when (nearly) all train problems have been drawn. A task may define
a canonical ``split_key`` (``arithmetic`` treats ``12+34`` and ``34+12`` as one problem) so that no variant of
an eval problem is trained on.
"""

from __future__ import annotations

import functools
import random

from rlzoo.interfaces import Sample, Task
from rlzoo_tasks._common import check_count, check_split, fresh, rng_for, take


class GeneratedTask(Task):
    """Base of the synthetic tasks (not registered itself)."""

    def draw(self, rng: random.Random) -> Sample:
        """One random problem."""
        raise NotImplementedError

    def universe_size(self) -> int:
        """The number of distinct split keys the generator can produce (a lower bound is fine)."""
        raise NotImplementedError

    def split_key(self, sample: Sample) -> str:
        """What must not be shared between train and eval: the prompt, or a canonical form of the problem."""
        return sample.prompt

    @functools.cached_property
    def eval_pool(self) -> list[Sample]:
        n_eval = min(self.params.eval_size, max(1, self.universe_size() // 5))
        rng = rng_for("rlzoo_tasks", self.name, "eval-pool")
        pool: list[Sample] = []
        seen: set[str] = set()
        attempts, limit = 0, 200 * n_eval + 10_000
        while len(pool) < n_eval and attempts < limit:
            attempts += 1
            sample = self.draw(rng)
            key = self.split_key(sample)
            if key not in seen:
                seen.add(key)
                pool.append(sample)
        return pool

    @functools.cached_property
    def _eval_keys(self) -> frozenset[str]:
        return frozenset(self.split_key(s) for s in self.eval_pool)

    def samples(self, split: str, count: int | None, seed: int) -> list[Sample]:
        check_split(split)
        check_count(count)
        if count is None:
            count = self.params.train_size if split == "train" else self.params.eval_size
        rng = rng_for("rlzoo_tasks", self.name, split, seed)
        if split == "eval":
            return take(self.eval_pool, count, rng)
        train_universe = max(1, self.universe_size() - len(self.eval_pool))
        patience = 50 * count + 1000
        out: list[Sample] = []
        seen: set[str] = set()
        attempts = 0
        while len(out) < count:
            sample = self.draw(rng)
            if self.split_key(sample) in self._eval_keys:
                continue
            attempts += 1
            if sample.prompt in seen and len(seen) < train_universe and attempts < patience:
                continue
            seen.add(sample.prompt)
            out.append(sample)
        return [fresh(s) for s in out]
