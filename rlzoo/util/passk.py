"""Pass@k: the unbiased estimator of the chance that at least one of k samples is correct.

Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1): with ``n`` samples of a prompt of
which ``c`` are correct, ``pass@k = 1 - C(n - c, k) / C(n, k)`` (1 when ``n - c < k``), averaged over prompts. It
needs ``k <= n``; the config checks that (``train.eval_pass_at_k`` against ``train.eval_samples_per_prompt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with ``c`` correct among ``n`` samples (``1 <= k <= n``, ``0 <= c <= n``)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n; got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(samples: Sequence[int], correct: Sequence[int], ks: Sequence[int]) -> dict[str, float]:
    """``{"eval/pass@k": mean over prompts}`` for each k; prompt i drew ``samples[i]`` responses, ``correct[i]`` right."""
    return {
        f"eval/pass@{k}": sum(pass_at_k(n, c, k) for n, c in zip(samples, correct, strict=True)) / len(samples)
        for k in ks
    }
