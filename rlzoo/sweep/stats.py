"""Mean and 95% confidence interval over seeds (Student t)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """``(mean, half-width)``: the interval ``mean ± t_{(1+level)/2, n-1} · s / sqrt(n)``, ``s`` the sample standard
    deviation (n - 1 in the denominator). One value has no interval (half-width nan); none gives ``(nan, nan)``."""
    from scipy.stats import t

    values = [v for v in values if math.isfinite(v)]
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)
