"""Which correction pays: what every registered mismatch correction would do to the measured batch.

Each correction the registry holds (kind ``correction``; the config's own with its parameters, the others with
their defaults) is applied to the measured log-probs as the loop applies it (``weights`` then ``keep`` with the
batch's advantages). Its effective weight per response token is ``w_t * keep_t`` (a rejected token weighs 0),
and over the ``n`` response tokens::

    kept        share of tokens with an effective weight > 0 (icepop's and tis-mask's zeroed weights count as
                dropped, as do rejected tokens)
    reweighted  share of tokens kept with a weight other than 1 (|w - 1| > 1e-6)
    ess         (sum_t w_t)^2 / (n sum_t w_t^2) of the effective weights (verl's rollout_is_eff_sample_size)
    mean, var   of the effective weights
    residual    mean over the kept tokens of |log r_t - log w_t|, r_t = pi_train / pi_rollout: how far the
                weight a token gets is from its exact ratio (0: the token's mismatch fully corrected; ``none``:
                the mean |log r| of the batch); a sequence-level weight is compared with the token's own ratio

With the training engine's gradients (:mod:`rlzoo.mismatch.gradients`) each correction also has ``bias``,
``grad_var``, ``cosine`` and ``mse``: its policy-gradient estimate against the on-policy one.

The recommendation (:func:`recommend`) is a stated rule, not advice: when the gap is rounding (mean |log r| below
:data:`NEGLIGIBLE`) ``none``; else, among the corrections whose ESS is at least :data:`MIN_ESS` (a guard: the
variance comes from a few minibatches, the ESS from every token), the one with the lowest gradient ``mse``
(``bias^2 + grad_var / H``, relative to the on-policy gradient's squared norm: the error of the run's mean gradient
over its ``H`` optimizer steps), an ``mse`` within :data:`MSE_TIE` of the lowest counting as equal, and among equals
``none`` first (a correction pays only when it lowers the error by more than that), then the smaller bias, then the
larger ESS, then the name. Without gradients (an engine that computes none, or a batch with no gradient), the
smallest ``residual`` instead (residuals within 1e-6 equal; ties: the larger ESS, then the name).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from rlzoo.config.base import ComponentSpec
from rlzoo.errors import RlzooError
from rlzoo.interfaces import MismatchCorrection
from rlzoo.interfaces.base import collecting
from rlzoo.mismatch.measures import MAX_LOG_RATIO, ess
from rlzoo.registry import Registry

NEGLIGIBLE = 1e-3  # mean |log r| below which the gap is float rounding and nothing is worth correcting
MIN_ESS = 0.9  # the least effective sample size (share of tokens) a recommended correction may leave
MSE_TIE = 0.01  # gradient MSEs within this share of the lowest count as equal


def correction_effect(
    correction: MismatchCorrection,
    train: torch.Tensor,
    rollout: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
) -> dict[str, float]:
    """The module docstring's numbers for one correction on ``[B, T]`` log-probs, mask and advantages."""
    valid = mask > 0
    with collecting():  # what it reports belongs to a step's metrics, not to this measurement
        weights = correction.weights(train, rollout, mask).detach().double()
        keep = correction.keep(train, rollout, mask, advantages).detach().double()
    effective = torch.where(valid, weights * keep, torch.zeros((), dtype=torch.float64))[valid]
    log_r = (train.double() - rollout.double())[valid].clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    kept = effective > 0
    residual = (log_r[kept] - torch.log(effective[kept])).abs()
    n = max(effective.numel(), 1)
    return {
        "kept": kept.sum().item() / n,
        "reweighted": (kept & ((effective - 1).abs() > 1e-6)).sum().item() / n,
        "ess": ess(effective),
        "mean": effective.mean().item() if effective.numel() else math.nan,
        "var": effective.var(unbiased=False).item() if effective.numel() else math.nan,
        "residual": residual.mean().item() if residual.numel() else math.nan,
    }


def build_corrections(registry: Registry, own: ComponentSpec) -> tuple[dict[str, MismatchCorrection], dict[str, str]]:
    """Every registered correction, by name: ``own`` (the config's ``algorithm.correction``) with its parameters,
    the others with their defaults; and the ones that cannot be built so (their error, by name)."""
    built, skipped = {}, {}
    for name in registry.names("correction"):
        try:
            built[name] = registry.create("correction", name, own.params if name == own.name else None)
        except RlzooError as err:  # a plugin's correction with required parameters: reported, not measured
            skipped[name] = str(err)
    return built, skipped


def compare_corrections(
    built: Mapping[str, MismatchCorrection],
    train: torch.Tensor,
    rollout: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
) -> dict[str, dict[str, float]]:
    """:func:`correction_effect` of every correction in ``built`` (by name), in name order."""
    return {name: correction_effect(built[name], train, rollout, mask, advantages) for name in sorted(built)}


def recommend(effects: Mapping[str, Mapping[str, float]], gap: float) -> dict[str, Any]:
    """The correction the module docstring's rule picks, and why, as ``{name, rule, reason}``."""
    usable = [n for n, e in effects.items() if e["ess"] >= MIN_ESS and not math.isnan(e["residual"])]
    graded = bool(usable) and all(math.isfinite(effects[n].get("mse", math.nan)) for n in usable)
    rule = (
        f"none if the mean |log r| is below {NEGLIGIBLE:g}; else, among the corrections with ESS >= {MIN_ESS:g}, "
        + (
            f"the lowest gradient MSE (bias^2 + variance / the run's optimizer steps, relative to the on-policy "
            f"gradient); MSEs within "
            f"{MSE_TIE:.0%} of the lowest are equal, and among equals none first, then the smaller bias, the larger "
            "ESS, the name"
            if graded
            else "the smallest residual (residuals within 1e-6 equal; ties: the larger ESS, then the name)"
        )
    )
    if gap < NEGLIGIBLE and "none" in effects:
        return {
            "name": "none",
            "rule": rule,
            "reason": f"mean |log r| = {gap:.3g} < {NEGLIGIBLE:g}: the engines agree to rounding",
        }
    if not usable:
        return {"name": None, "rule": rule, "reason": f"every correction leaves an ESS below {MIN_ESS:g}"}
    if graded:
        lowest = min(effects[n]["mse"] for n in usable)
        equal = [n for n in usable if effects[n]["mse"] <= lowest * (1 + MSE_TIE)]
        name = "none" if "none" in equal else min(equal, key=lambda n: (effects[n]["bias"], -effects[n]["ess"], n))
        e = effects[name]
        reason = (
            f"gradient MSE {e['mse']:.3g} (bias {e['bias']:.3g}, variance {e['grad_var']:.3g}, cosine "
            f"{e['cosine']:.4f}) at ESS {e['ess']:.3f}, keeping {e['kept']:.1%} of the tokens"
        )
        return {"name": name, "rule": rule, "reason": reason}
    name = min(usable, key=lambda n: (round(effects[n]["residual"], 6), -effects[n]["ess"], n))
    e = effects[name]
    return {
        "name": name,
        "rule": rule,
        "reason": f"residual {e['residual']:.3g} at ESS {e['ess']:.3f}, keeping {e['kept']:.1%} of the tokens",
    }
