"""``--fail-above METRIC=VALUE``: the bounds a measured gap must stay within, checked before and after measuring.

The bounds are read before anything starts (an unknown metric or a value that is no finite number is a one-line
error naming the accepted metrics or the flag); after the measurement each bound is compared with the metric's
value, and every metric above its bound is one line (``METRIC = value > bound``): the command then exits 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rlzoo.errors import RlzooError
from rlzoo.mismatch.measures import THRESHOLDS, threshold_name

#: the metrics a bound may name (mismatch.json's ``metrics``; docs/mismatch.md says what each means)
GATE_METRICS: tuple[str, ...] = (
    "abs_logp_diff",
    "abs_logp_diff_max",
    "abs_logp_diff_p50",
    "abs_logp_diff_p99",
    "k1_kl",
    "k3_kl",
    "chi2_token",
    "chi2_seq",
    "log_ppl_abs_diff",
    *(threshold_name(x) for x in THRESHOLDS),
    "router_disagreement",
    "abs_logp_diff_no_replay",
)


def parse_bounds(texts: Sequence[str]) -> dict[str, float]:
    """``["abs_logp_diff=0.05", ...]`` as ``{metric: bound}``; a bad one is an :class:`RlzooError` naming it."""
    bounds = {}
    for text in texts:
        metric, sep, value = text.rpartition("=")
        if not sep or not metric:
            raise RlzooError(f"--fail-above {text!r}: write METRIC=VALUE, e.g. abs_logp_diff=0.05")
        if metric not in GATE_METRICS:
            raise RlzooError(f"--fail-above: unknown metric {metric!r}; accepted: {', '.join(GATE_METRICS)}")
        try:
            bound = float(value)
        except ValueError:
            bound = math.nan
        if not math.isfinite(bound):
            raise RlzooError(f"--fail-above {text!r}: {value!r} is not a finite number")
        bounds[metric] = bound
    return bounds


def exceeded(metrics: Mapping[str, float], bounds: Mapping[str, float]) -> list[str]:
    """One line per bound the measured ``metrics`` pass (``METRIC = value > bound``); a bounded metric that was
    not measured (router_disagreement of a dense model) is an error naming it."""
    missing = [m for m in bounds if m not in metrics]
    if missing:
        raise RlzooError(
            f"--fail-above: {', '.join(missing)} was not measured for this config (a dense model, or a "
            "rollout engine that records no experts, has no router disagreement)"
        )
    return [f"{m} = {metrics[m]:.6g} > {bound:g}" for m, bound in bounds.items() if not metrics[m] <= bound]
