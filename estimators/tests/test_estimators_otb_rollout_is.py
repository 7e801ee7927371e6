"""The optimal token baselines' rollout importance-sampling option (``rollout_is``) against verl 0.9.1.

verl's ``compute_optimal_token_baseline_advantage`` and ``compute_multi_turn_optimal_token_baseline_advantage``
take ``rollout_is_weights`` and multiply each step's energy ``1 - 2 pi_t + sum pi^2`` by its square before the
cumulative sum. verl cannot be installed beside this environment's torch, so this test holds no recording of that
option: :func:`verl_otb` below is verl 0.9.1's procedure written out independently here (plain loops over groups
and positions, none of rlzoo's code), and is first checked against verl's own recorded outputs without weights
(``reference/verl_2026.json``, from ``scripts/record_reference.py``) before it serves as the reference with
weights. Checked to 1e-6 (absolute) on the recorded inputs: left-aligned responses with groups of 4, 4 and 1 and
an empty response, and responses with holes (multi-turn), each with and without the zero tail.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from estimators_testlib import create, t

from rlzoo.config.resolution import build_config
from rlzoo.interfaces import RewardBatch
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry

DATA = json.loads((pathlib.Path(__file__).parent / "reference" / "verl_2026.json").read_text())
CASES = [c for c in DATA["advantages"] if "optimal_token_baseline" in c["id"]]
NAMES = {"optimal_token_baseline": "optimal-token-baseline", "tir_optimal_token_baseline": "tir-optimal-token-baseline"}
TOL = 1e-6


def verl_otb(case, weights: list[list[float]] | None, multi_turn: bool, zero_tail: bool, eps: float = 1e-8):
    """verl 0.9.1's optimal token baseline, transcribed: returns ``G``; energies ``w_t = (1 - 2 exp(old_t) +
    sum_pi_squared_t) * rho_t^2`` summed over the valid steps up to ``t``; per prompt group (of non-empty responses,
    multi-turn) and position ``b_t = sum G W / (sum W + eps)`` (positions: columns, or multi-turn the n-th valid
    token), none for a lone response; the unique longest response's baseline 0 from the second longest's length."""
    x = case["inputs"]
    mask, rewards, old, spi = x["mask"], x["token_rewards"], x["old_logprobs"], x["sum_pi_squared"]
    rows, width = len(mask), len(mask[0])
    returns, energy = [], []
    for i in range(rows):
        g = [0.0] * width
        for k in reversed(range(width)):
            g[k] = rewards[i][k] * mask[i][k] + (g[k + 1] if k + 1 < width else 0.0)
        w, total = [0.0] * width, 0.0
        for k in range(width):
            step = 1.0 - 2.0 * torch.tensor(old[i][k], dtype=torch.float64).exp().item() + spi[i][k]
            if weights is not None:
                step *= weights[i][k] ** 2
            total += step * mask[i][k]
            w[k] = total
        returns.append(g)
        energy.append(w)
    if multi_turn:  # the n-th valid token of each response is position n
        columns = [[k for k in range(width) if mask[i][k] > 0] for i in range(rows)]
    else:
        columns = [list(range(width)) for _ in range(rows)]
    groups: dict[int, list[int]] = {}
    for i, group in enumerate(x["group_index"]):
        if not (multi_turn and not columns[i]):
            groups.setdefault(group, []).append(i)
    valid = [[1.0] * len(columns[i]) for i in range(rows)] if multi_turn else mask
    length = [int(sum(mask[i])) for i in range(rows)]
    advantages = [[0.0] * width for _ in range(rows)]
    for members in groups.values():
        span = max(len(columns[i]) for i in members)
        base = {i: [0.0] * span for i in members}
        if len(members) > 1:
            for n in range(span):
                num = den = 0.0
                for i in members:
                    if n < len(columns[i]):
                        c = columns[i][n]
                        num += returns[i][c] * energy[i][c] * valid[i][n]
                        den += energy[i][c] * valid[i][n]
                for i in members:
                    base[i][n] = num / (den + eps)
            ordered = sorted(length[i] for i in members)
            longest = [i for i in members if length[i] == ordered[-1]]
            if zero_tail and len(longest) == 1 and ordered[-1] > ordered[-2]:
                base[longest[0]][ordered[-2] :] = [0.0] * (span - ordered[-2])
        for i in members:
            for n, c in enumerate(columns[i]):
                if mask[i][c] > 0:
                    advantages[i][c] = returns[i][c] - base[i][n]
    return torch.tensor(advantages, dtype=torch.float64)


def is_weights(mask: list[list[float]], seed: int) -> torch.Tensor:
    """Truncated importance weights ``min(exp(old_train - old_rollout), 2)`` from a gap of up to +-0.8 nats, so
    some tokens are down-weighted, some up, some capped (as ``tis`` gives them)."""
    g = torch.Generator().manual_seed(seed)
    gap = (torch.rand(t(mask).shape, generator=g, dtype=torch.float64) - 0.5) * 1.6
    return gap.exp().clamp(max=2.0) * t(mask)


def batch_of(case, weights: torch.Tensor | None) -> RewardBatch:
    x = case["inputs"]
    mask = t(x["mask"])
    return RewardBatch(
        torch.zeros(len(mask), dtype=torch.float64),
        torch.tensor(x["group_index"]),
        mask,
        token_rewards=t(x["token_rewards"]),
        old_logprobs=t(x["old_logprobs"]),
        token_stats={"sum_pi_squared": t(x["sum_pi_squared"])},
        rollout_is_weights=weights,
    )


def source_of(case, rollout_is: bool):
    verl_name, _, zero_tail = case["id"].rpartition("-")
    name = NAMES[verl_name.rsplit("-", 1)[0]]
    return create("advantage", name, zero_tail=zero_tail == "True", rollout_is=rollout_is)


def test_the_cases_are_the_recorded_ones():
    assert DATA["source"] == "verl 0.9.1, trl 1.16.0"
    assert len(CASES) == 8 and {c["verl"]["params"]["handle_zero_tail"] for c in CASES} == {True, False}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_the_transcription_reproduces_verls_recorded_outputs_without_weights(case):
    multi_turn = case["id"].startswith("tir_")
    mine = verl_otb(case, None, multi_turn, case["verl"]["params"]["handle_zero_tail"])
    torch.testing.assert_close(mine, t(case["outputs"]["advantages"]) * t(case["inputs"]["mask"]), rtol=0, atol=TOL)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_rollout_is_matches_verl_with_its_weights(case):
    weights = is_weights(case["inputs"]["mask"], seed=len(case["id"]))
    multi_turn = case["id"].startswith("tir_")
    expected = verl_otb(case, weights.tolist(), multi_turn, case["verl"]["params"]["handle_zero_tail"])
    got = source_of(case, rollout_is=True).compute(batch_of(case, weights))
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL)
    unweighted = source_of(case, rollout_is=False).compute(batch_of(case, weights))  # the weights are not read
    recorded = t(case["outputs"]["advantages"]) * t(case["inputs"]["mask"])
    torch.testing.assert_close(unweighted, recorded, rtol=0, atol=TOL)
    assert (got - unweighted).abs().max() > 1e-3  # the weights change the baseline of these cases


def test_unit_weights_change_nothing_and_missing_weights_are_named():
    case = CASES[0]
    ones = t(case["inputs"]["mask"])
    torch.testing.assert_close(
        source_of(case, rollout_is=True).compute(batch_of(case, ones)),
        source_of(case, rollout_is=False).compute(batch_of(case, None)),
        rtol=0,
        atol=1e-12,
    )
    with pytest.raises(ValueError, match=r"needs RewardBatch.rollout_is_weights \(the train-inference correction"):
        source_of(case, rollout_is=True).compute(batch_of(case, None))


@pytest.mark.parametrize("name", sorted(NAMES.values()))
def test_rlzoo_train_accepts_rollout_is(name, tmp_path):
    """The step hands the correction's weights to the advantage (rlzoo.rl.advantages.reward_batch, tested in
    tests/test_step_advantages.py), so the option passes the start-up check."""
    registry = default_registry()
    data = {
        "output_dir": str(tmp_path / "run"),
        "algorithm": {"advantage": {"name": name, "rollout_is": True}, "router": None},
    }
    preflight(build_config(data, registry=registry), registry)
