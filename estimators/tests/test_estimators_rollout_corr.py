"""rlzoo's rollout corrections against verl's and TRL's own functions, to 1e-6: the data is
estimators/tests/reference/verl_rollout_corr.json, recorded by ``record_rollout_corr`` in scripts/record_reference.py.

- verl 0.9.1's ``rollout_corr_helper``: importance weights (``compute_rollout_correction_weights``: TIS, IcePop,
  batch normalisation), rejection masks (``compute_rollout_rejection_mask``: every ``rollout_rs`` option and
  chains of them), their metrics where rlzoo reports the same quantity, and each ``RolloutCorrectionConfig``
  preset through ``compute_rollout_correction_and_rejection_mask`` against its rlzoo setting
  (``rlzoo.config.presets.ROLLOUT_CORRECTIONS``).
- TRL 1.16's off-policy sequence mask (``GRPOTrainer.get_off_policy_mask``, a static method) against ``opsm``.
- TRL's ``vllm_importance_sampling_mode`` weights are computed inline in
  ``GRPOTrainer._generate_and_score_completions``, which needs a model, a vLLM server and an accelerator; no TRL
  function computes them on tensors. They are checked
  here against an independent float64 re-derivation of the four modes from that code (:func:`trl_weights`), not
  against TRL's own output.
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch
from estimators_testlib import REGISTRY, create, t

from rlzoo.config.algorithm import AlgorithmConfig
from rlzoo.config.presets import ROLLOUT_CORRECTIONS, expand_preset
from rlzoo.interfaces.base import take_reports
from rlzoo.rl.objective import Objective

DATA = json.loads((pathlib.Path(__file__).parent / "reference" / "verl_rollout_corr.json").read_text())
TOL = 1e-6


def inputs(case: dict) -> tuple[torch.Tensor, ...]:
    x = case["inputs"]
    return t(x["old_train"]), t(x["old_rollout"]), t(x["mask"])


def correction(spec: dict):
    spec = dict(spec)
    return REGISTRY.create("correction", spec.pop("name"), spec)


def close(ours: float, theirs: float, what: str) -> None:
    assert abs(float(ours) - theirs) <= TOL, f"{what}: rlzoo {float(ours)!r}, reference {theirs!r}"


def test_the_data_is_verls_and_trls():
    assert DATA["source"] == "verl 0.9.1, trl 1.16.0"
    assert all(DATA[k] for k in ("rollout_is", "rollout_rs", "presets", "trl_opsm"))


# ----------------------------------------------------------------------------------------------- importance weights


def is_specs(verl: dict) -> list[dict]:
    """rlzoo correction specs computing verl's ``rollout_is`` weights: a number is TIS, ``"lo_hi"`` IcePop (as
    ``icepop`` and as ``tis`` masking outside ``[low, threshold]``)."""
    level, threshold = verl["rollout_is"], verl["rollout_is_threshold"]
    if isinstance(threshold, str):
        low, high = map(float, threshold.split("_"))
        return [
            {"name": "icepop", "level": level, "low": low, "high": high},
            {"name": "tis", "level": level, "action": "mask", "low": low, "threshold": high},
        ]
    return [{"name": "tis", "level": level, "threshold": threshold, "normalize": verl["rollout_is_batch_normalize"]}]


@pytest.mark.parametrize("case", DATA["rollout_is"], ids=lambda c: c["id"])
def test_importance_weights_match_verl(case):
    train, rollout, mask = inputs(case)
    verl, out = case["verl"], case["outputs"]
    for spec in is_specs(verl):
        c = correction(spec)
        weights = c.weights(train, rollout, mask)
        torch.testing.assert_close(weights, t(out["weights"]), rtol=0, atol=TOL)
        metrics = take_reports(c)
        prefix = f"correction/{spec['name']}/"
        if isinstance(verl["rollout_is_threshold"], str):  # IcePop: the share of tokens dropped
            close(metrics[prefix + "oob_fraction"], out["metrics"]["rollout_is_oob_ratio"], "oob_fraction")
        elif verl["rollout_is"] == "token":  # TIS: the share of tokens above C (verl: per response at sequence level)
            close(metrics[prefix + "oob_fraction"], out["metrics"]["rollout_is_ratio_fraction_high"], "oob_fraction")
        if spec.get("normalize"):
            close(metrics[prefix + "norm_factor"], out["metrics"]["rollout_is_batch_norm_factor"], "norm_factor")
        else:  # the loop logs it as mismatch/weight_mean
            close((weights * mask).sum() / mask.sum(), out["metrics"]["rollout_is_mean"], "weight mean")


# ----------------------------------------------------------------------------------------------- rejection sampling


def criteria_of(options: str, threshold: str | float) -> list[dict]:
    """verl's ``rollout_rs`` / ``rollout_rs_threshold`` as rlzoo's ``rejection.criteria``."""
    names = options.split(",")
    specs = str(threshold).split(",")
    specs = specs * len(names) if len(specs) == 1 else specs
    criteria = []
    for name, spec in zip(names, specs, strict=True):
        level, statistic = name.rsplit("_", 1)
        criterion = {"statistic": statistic, "level": level}
        if "_" in spec:
            low, high = map(float, spec.split("_"))
            criterion.update(low=low, high=high)
        else:
            criterion["high"] = float(spec)
        criteria.append(criterion)
    return criteria


def check_rejection(c, keep: torch.Tensor, mask: torch.Tensor, expected_mask: list, metrics: dict, options: str):
    torch.testing.assert_close(mask * keep, t(expected_mask), rtol=0, atol=0)
    ours = take_reports(c)
    prefix = f"correction/{c.name}/"
    close(ours[prefix + "masked_fraction"], metrics["rollout_rs_masked_fraction"], "masked_fraction")
    # verl's overall sequence share counts the empty responses too; rlzoo's only responses with a token
    responses = (mask > 0).any(dim=-1)
    verl_share = metrics["rollout_rs_seq_masked_fraction"] * len(responses) / int(responses.sum())
    close(ours[prefix + "seq_masked_fraction"], verl_share, "seq_masked_fraction")
    for option in options.split(","):
        for metric in ("masked_fraction", "max", "min"):
            close(ours[f"{prefix}{option}_{metric}"], metrics[f"rollout_rs_{option}_{metric}"], f"{option}_{metric}")


@pytest.mark.parametrize("case", DATA["rollout_rs"], ids=lambda c: c["id"])
def test_rejection_matches_verl(case):
    train, rollout, mask = inputs(case)
    verl, out = case["verl"], case["outputs"]
    c = correction({"name": "rejection", "criteria": criteria_of(verl["rollout_rs"], verl["rollout_rs_threshold"])})
    keep = c.keep(train, rollout, mask, torch.zeros_like(mask))
    check_rejection(c, keep, mask, out["mask"], out["metrics"], verl["rollout_rs"])
    torch.testing.assert_close(c.weights(train, rollout, mask), mask)  # no importance: weight 1 on every token


# ---------------------------------------------------------------------------------------------------------- presets

# verl 0.9.1's RolloutCorrectionConfig factories but the bypass_pg_* ones (a REINFORCE policy loss): those recorded,
# and the two that compute no correction
VERL_PRESETS = {*(case["id"] for case in DATA["presets"]), "bypass_ppo_clip", "disabled"}


def test_every_verl_rollout_correction_preset_has_its_rlzoo_setting():
    assert set(ROLLOUT_CORRECTIONS) == VERL_PRESETS
    for name, fields in ROLLOUT_CORRECTIONS.items():
        algorithm = AlgorithmConfig.model_validate(expand_preset({"preset": "grpo", **fields}))
        REGISTRY.create("correction", algorithm.correction.name, algorithm.correction.params)
        bypass = name.startswith("bypass")
        assert (algorithm.old_logprobs != "train") == bypass, name  # verl's bypass: the rollout's are the old ones
    assert ROLLOUT_CORRECTIONS["bypass_ppo_clip"] == {"old_logprobs": "rollout-only"}  # no pass, no correction


def test_the_correction_page_lists_every_named_setting():
    page = (pathlib.Path(__file__).parents[2] / "docs" / "components" / "correction.md").read_text()
    section = page.split("## verl's rollout-correction presets")[1].split("\n## ")[0]
    rows = [line.split("|")[1].strip().strip("`") for line in section.splitlines() if line.startswith("| `")]
    assert rows == list(ROLLOUT_CORRECTIONS)


@pytest.mark.parametrize("case", DATA["presets"], ids=lambda c: c["id"])
def test_preset_settings_reproduce_verls_presets(case):
    train, rollout, mask = inputs(case)
    out = case["outputs"]
    c = correction(ROLLOUT_CORRECTIONS[case["id"]]["correction"])
    weights = c.weights(train, rollout, mask)
    expected = mask if out["weights"] is None else t(out["weights"])  # verl without IS: no weights, i.e. 1
    torch.testing.assert_close(weights * mask, expected, rtol=0, atol=TOL)
    keep = c.keep(train, rollout, mask, torch.zeros_like(mask))
    torch.testing.assert_close(mask * keep, t(out["mask"]), rtol=0, atol=0)
    if case["verl"]["rollout_rs"] is not None:
        check_rejection(c, keep, mask, out["mask"], out["metrics"], case["verl"]["rollout_rs"])


# ------------------------------------------------------------------------------------------------------------- TRL


@pytest.mark.parametrize("case", DATA["trl_opsm"], ids=lambda c: c["id"])
def test_opsm_matches_trls_off_policy_mask(case):
    train, rollout, mask = inputs(case)
    adv = t(case["inputs"]["advantages"])
    c = create("correction", "opsm", threshold=case["trl"]["off_policy_mask_threshold"])
    keep = c.keep(train, rollout, mask, adv)
    expected = t(case["outputs"]["mask"]) * mask
    torch.testing.assert_close(keep * mask, expected, rtol=0, atol=0)
    reports = take_reports(c)
    dropped = ((1 - expected) * mask).sum() / mask.sum()
    close(reports["correction/opsm/masked_fraction"], float(dropped), "masked_fraction")
    torch.testing.assert_close(c.weights(train, rollout, mask), mask)


def trl_weights(mode: str, clip_min: float | None, clip_max: float | None, old, sampling, mask) -> torch.Tensor:
    """TRL's ``vllm_importance_sampling_ratio``, re-derived in float64 from ``_generate_and_score_completions``:
    ``exp((old - sampling) * m)`` per token, or of its row sum; ``*_truncate`` clamps to ``[clip_min, clip_max]``,
    ``*_mask`` zeroes what lies outside. (TRL leaves padding at 1; its loss masks padding out.)"""
    diff = (old - sampling) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff).expand_as(mask)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min", [None, 0.6])
def test_tis_is_trls_importance_sampling_modes(mode, clip_min):
    """``tis`` with ``level``/``action`` = TRL's mode, ``threshold`` = ``vllm_importance_sampling_clip_max`` (3.0,
    TRL's default) and ``low`` = ``vllm_importance_sampling_clip_min``."""
    level, action = mode.split("_")
    exercised = False
    for case in DATA["rollout_is"]:
        train, rollout, mask = inputs(case)
        ours = create("correction", "tis", level=level, action=action, threshold=3.0, low=clip_min)
        expected = trl_weights(mode, clip_min, 3.0, train, rollout, mask) * mask
        torch.testing.assert_close(ours.weights(train, rollout, mask), expected, rtol=1e-12, atol=TOL)
        exercised |= bool(take_reports(ours)["correction/tis/oob_fraction"] > 0)
    assert exercised, "no recorded batch puts a weight outside the bounds"


# ----------------------------------------------------------------------------------------------------- composition


def test_a_rejected_response_is_padding_to_every_aggregation():
    """The loss over a batch with a response rejected equals the loss over the batch without that response, for
    each aggregation: rejected tokens leave the denominators (verl's rewritten response mask)."""
    case = next(c for c in DATA["presets"] if c["id"] == "decoupled_k3_rs")
    train, rollout, mask = inputs(case)
    keep = correction(ROLLOUT_CORRECTIONS["decoupled_k3_rs"]["correction"]).keep(train, rollout, mask, mask)
    rejected = ((keep < 1) & (mask > 0)).any(dim=-1)
    assert rejected.any() and not rejected[mask.sum(dim=-1) > 0].all()
    g = torch.Generator().manual_seed(0)
    logp = train + 0.1 * torch.randn(train.shape, generator=g, dtype=torch.float64)
    adv = torch.randn(len(mask), 1, generator=g, dtype=torch.float64).expand_as(mask).clone()
    for aggregation in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        objective = Objective(
            create("ratio", "token"), create("clipper", "ppo"), create("aggregation", aggregation), create("kl", "k3")
        )
        with_rejection, _ = objective(logp, train, adv, mask * keep)
        rows = ~rejected
        without, _ = objective(logp[rows], train[rows], adv[rows], mask[rows])
        torch.testing.assert_close(with_rejection, without, rtol=1e-12, atol=1e-12)
