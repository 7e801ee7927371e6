"""Record reference outputs of verl's own loss, advantage, value, KL and correction functions as rlzoo test data.

    python scripts/record_reference.py [--out estimators/tests/reference/verl.json] [--target DIR]

The pinned wheels (``PINS``) are installed with ``pip install --no-deps --target`` into a throwaway folder (a
temporary one unless ``--target`` names one), never into the environment and never as a project dependency. The
script then re-runs itself in a subprocess with that folder first on ``PYTHONPATH`` and calls verl's functions on
float64 tensors: ``core_algos.get_policy_loss_fn`` (loss, gradient w.r.t. the log-probs, clip fractions),
``core_algos.agg_loss``, the advantage estimators, ``compute_gae_advantage_return``, ``compute_value_loss``,
``kl_penalty``, the KL controllers and ``rollout_corr_helper.compute_rollout_correction_weights``. Nothing of
verl is stubbed. The output is JSON, every float written with Python's shortest round-trip repr, so the float64
values come back bit-exact.
``estimators/tests/test_estimators_reference.py`` feeds the same inputs to rlzoo's components.

Rollout correction is recorded apart (``record_rollout_corr``), into
``estimators/tests/reference/verl_rollout_corr.json`` (``--rollout-corr-out``): verl's ``rollout_corr_helper`` (IS
weights, rejection masks, their metrics, and each ``RolloutCorrectionConfig`` preset through
``compute_rollout_correction_and_rejection_mask``) and TRL's ``GRPOTrainer.get_off_policy_mask`` (a static method,
the one TRL function recorded; ``ROLLOUT_CORR_PINS``, its imports from the environment).
``estimators/tests/test_estimators_rollout_corr.py`` checks rlzoo's corrections against it.

TRL is not recorded: its losses live inline in ``GRPOTrainer._compute_loss``, which needs a model and an
accelerator, and TRL exposes no function that computes them on plain tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# verl and exactly what ``import verl.trainer.ppo.core_algos`` needs beyond torch / numpy / pyyaml / packaging
PINS = [
    "verl==0.9.1",
    "omegaconf==2.3.0",
    "antlr4-python3-runtime==4.9.3",
    "tensordict==0.15.3",
    "pyvers==0.2.3",
    "codetiming==1.4.0",
    "orjson==3.13.0",
    "ray==2.60.0",
]
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "estimators" / "tests" / "reference" / "verl.json"
# TRL for its off-policy sequence mask (a static method callable on tensors); transformers, accelerate, datasets and
# pandas, which importing its trainer needs, come from the environment
ROLLOUT_CORR_PINS = ["trl==1.16.0"]
ROLLOUT_CORR_OUT = DEFAULT_OUT.parent / "verl_rollout_corr.json"
# the 2026 zoo (record_2026): verl's DPPO / DRO losses and ReMax / pass@k / GDPO / optimal-token-baseline advantages
# (verl 0.9.1 above), TRL's VESPO weights; TRL's own imports (transformers, accelerate, datasets, pandas) are the
# environment's
PINS_2026 = ["trl==1.16.0"]
OUT_2026 = DEFAULT_OUT.with_name("verl_2026.json")


def install(target: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), *PINS]
    subprocess.run(cmd, check=True)


# ---------------------------------------------------------------------------------------------------------------
# Everything below runs inside the subprocess, with the throwaway folder importable.


def _inputs(seed: int, *, rows: int = 6, width: int = 7, empty_row: bool = True, spread: float = 0.35):
    """float64 policy-loss inputs: padding holds finite junk, one row may be fully masked."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (rows,), generator=g)
    if empty_row:
        lengths[rows // 2] = 0
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    old = -(torch.rand(rows, width, generator=g, dtype=torch.float64) * 4.0 + 0.05)
    logp = old + torch.randn(rows, width, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, width).clone()
    junk = torch.full_like(old, -1.0)
    logp, old = torch.where(mask > 0, logp, junk), torch.where(mask > 0, old, junk)
    return logp, old, adv * mask, mask


def _actor_config(**fields):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    policy_loss = PolicyLossConfig(**fields.pop("policy_loss", {}))
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy_loss, **fields)


def _policy_case(case_id, loss_mode, agg, config_fields, seed, **input_kw):
    import torch
    from verl.trainer.ppo import core_algos

    logp, old, adv, mask = _inputs(seed, **input_kw)
    config = _actor_config(**config_fields)
    results = []
    for rng_seed in (0, 1):  # a random draw (clip_cov) must not decide the recorded case
        torch.manual_seed(rng_seed)
        x = logp.clone().requires_grad_()
        loss, metrics = core_algos.get_policy_loss_fn(loss_mode)(old, x, adv, mask, agg, config, None)
        loss.backward()
        results.append((loss.item(), x.grad.tolist(), metrics))
    if results[0] != results[1]:
        raise RuntimeError(f"case {case_id}: verl's result depends on its random draw; pick other inputs")
    loss, grad, metrics = results[0]
    return {
        "id": case_id,
        "verl": {"loss_mode": loss_mode, "loss_agg_mode": agg, "config": config_fields},
        "inputs": {"logp": logp.tolist(), "old_logp": old.tolist(), "advantages": adv.tolist(), "mask": mask.tolist()},
        "outputs": {"loss": loss, "grad": grad, **{k.split("/")[-1]: float(v) for k, v in metrics.items()}},
    }


def _policy_cases():
    ppo = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    no_dual = {**ppo, "clip_ratio_c": 1e9}  # verl's vanilla loss always dual-clips; c -> infinity is plain PPO
    cases = [
        _policy_case(f"vanilla-{agg}", "vanilla", agg, no_dual, seed)
        for seed, agg in enumerate(
            ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
        )
    ]
    cases += [
        _policy_case("vanilla-dual-clip", "vanilla", "token-mean", {**ppo, "clip_ratio_c": 3.0}, 11, spread=1.5),
        _policy_case(
            "gspo", "gspo", "seq-mean-token-mean", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}, 12, spread=0.02
        ),
        _policy_case("cispo", "cispo", "token-mean", {"clip_ratio_low": 1.0, "clip_ratio_high": 0.3}, 13, spread=0.5),
        _policy_case("sapo", "sapo", "seq-mean-token-mean", {"tau_pos": 1.0, "tau_neg": 1.05}, 14, spread=0.6),
        _policy_case("gpg", "gpg", "token-mean", {}, 15),
        _policy_case(
            "geo_mean",
            "geo_mean",
            "seq-mean-token-mean",
            {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4},
            16,
            empty_row=False,
            spread=0.5,
        ),
        _policy_case(
            "kl_cov", "kl_cov", "token-mean", {"policy_loss": {"kl_cov_ratio": 0.1, "ppo_kl_coef": 1.0}}, 17, spread=0.5
        ),
        _policy_case(
            "clip_cov",
            "clip_cov",
            "token-mean",
            {**ppo, "policy_loss": {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.2, "clip_cov_ub": 5.0}},
            18,
            spread=0.3,
        ),
    ]
    # each case must exercise what it is there for (a clip that never fires proves nothing)
    exercised = {"vanilla-dual-clip": "pg_clipfrac_lower", "cispo": "pg_clipfrac", "geo_mean": "pg_clipfrac"}
    exercised.update({"clip_cov": "pg_clipfrac", "gspo": "pg_clipfrac", "vanilla-token-mean": "pg_clipfrac"})
    for case in cases:
        key = exercised.get(case["id"])
        if key is not None and not case["outputs"][key] > 0:
            raise RuntimeError(f"case {case['id']}: {key} is 0; pick inputs that exercise it")
    return cases


def _reward_batch(seed: int, rows: int = 8, width: int = 6, group: int = 4):
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    rewards = (torch.rand(rows, generator=g, dtype=torch.float64) > 0.5).to(torch.float64)
    rewards[0], rewards[1] = 0.0, 1.0  # no constant group 0
    rewards = rewards + torch.rand(rows, generator=g, dtype=torch.float64) * 0.5 * (rewards > 0)  # graded, zeros kept
    index = np.array([i // group for i in range(rows)])
    token_rewards = torch.zeros(rows, width, dtype=torch.float64)
    token_rewards[torch.arange(rows), lengths - 1] = rewards  # the outcome reward sits at the last valid token
    return rewards, index, mask, token_rewards


def _advantage_cases():
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos

    cases = []
    specs = [
        ("grpo", {"norm_adv_by_std_in_grpo": True}),
        ("grpo", {"norm_adv_by_std_in_grpo": False}),
        ("rloo", {}),
        ("reinforce_plus_plus", {"gamma": 1.0}),
        ("reinforce_plus_plus", {"gamma": 0.9}),
        ("reinforce_plus_plus_baseline", {}),
        ("opo", {}),
        ("gpg", {}),
    ]
    for seed, (name, params) in enumerate(specs):
        rewards, index, mask, token_rewards = _reward_batch(100 + seed)
        fn = core_algos.get_adv_estimator_fn(name)
        if name == "reinforce_plus_plus":
            adv, _ = fn(token_rewards, mask, config=AlgoConfig(gamma=params["gamma"]))
        elif name == "grpo":
            adv, _ = fn(token_rewards, mask, index, **params)
        else:
            adv, _ = fn(token_rewards, mask, index, config=AlgoConfig())
        cases.append(
            {
                "id": f"{name}-{seed}",
                "verl": {"adv_estimator": name, "params": params},
                "inputs": {"rewards": rewards.tolist(), "group_index": index.tolist(), "mask": mask.tolist()},
                "outputs": {"advantages": adv.tolist()},
            }
        )
    return cases


def _kl_cases():
    import torch
    from verl.trainer.ppo import core_algos

    g = torch.Generator().manual_seed(200)
    logp = -(torch.rand(4, 5, generator=g, dtype=torch.float64) * 3.0 + 0.05)
    ref = logp + torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.8
    return [
        {
            "id": f"kl-{mode}",
            "verl": {"kl_penalty": mode},
            "inputs": {"logp": logp.tolist(), "ref_logp": ref.tolist()},
            "outputs": {"kl": core_algos.kl_penalty(logp, ref, mode).tolist()},
        }
        for mode in ["k1", "k2", "low_var_kl"]
    ]


def _correction_cases():
    import torch
    from verl.trainer.ppo import rollout_corr_helper

    g = torch.Generator().manual_seed(300)
    rows, width = 6, 5
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    old_rollout = -(torch.rand(rows, width, generator=g, dtype=torch.float64) * 3.0 + 0.05)
    old_train = old_rollout + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.6
    cases = []
    for level in ["token", "sequence"]:
        for threshold in [2.0, "0.5_5.0"]:
            weights, _ = rollout_corr_helper.compute_rollout_correction_weights(
                old_train - old_rollout, mask, rollout_is=level, rollout_is_threshold=threshold
            )
            cases.append(
                {
                    "id": f"rollout_is-{level}-{threshold}",
                    "verl": {"rollout_is": level, "rollout_is_threshold": threshold},
                    "inputs": {
                        "old_train": old_train.tolist(),
                        "old_rollout": old_rollout.tolist(),
                        "mask": mask.tolist(),
                    },
                    "outputs": {"weights": weights.tolist()},
                }
            )
    return cases


def _episode_batch(seed: int, rows: int = 7, width: int = 12):
    """float64 GAE inputs shaped like multi-turn episodes: holes (observation tokens, mask 0) inside responses, a
    response that starts with a hole, a fully masked row, per-turn rewards, and finite junk at masked positions."""
    import torch

    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, width, dtype=torch.float64)
    for i in range(rows):
        length = int(torch.randint(width // 2, width + 1, (1,), generator=g))
        mask[i, :length] = 1.0
        if i % 2 == 0:  # one or two observation spans inside the response
            for _ in range(1 + i % 4 // 2):
                start = int(torch.randint(1, max(2, length - 2), (1,), generator=g))
                mask[i, start : start + int(torch.randint(1, 3, (1,), generator=g))] = 0.0
    mask[1, :2] = 0.0  # a response that starts with a hole
    mask[rows // 2] = 0.0  # a fully masked row
    keep = mask > 0
    # turn rewards at the last policy token before each hole, the outcome at the last one, a small dense term
    # (the KL in the reward) on every policy token
    ends = keep & ~torch.cat([keep[:, 1:], torch.zeros(rows, 1, dtype=torch.bool)], dim=1)
    rewards = torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.05
    rewards = rewards + ends * torch.rand(rows, width, generator=g, dtype=torch.float64)
    values = torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.5
    junk_r, junk_v = torch.full_like(rewards, 5.0), torch.full_like(values, -7.0)
    rewards, values = torch.where(keep, rewards, junk_r), torch.where(keep, values, junk_v)
    inner = keep[:, :1].new_zeros(rows, dtype=torch.bool)
    for i in range(rows):
        valid = keep[i].nonzero().flatten()
        inner[i] = len(valid) > 0 and bool((~keep[i, valid[0] : valid[-1] + 1]).any())
    if not inner.any():
        raise RuntimeError("the GAE batch must have holes inside a response")
    return rewards, values, mask


def _gae_cases():
    from verl.trainer.ppo import core_algos

    cases = []
    for seed, (gamma, lam) in enumerate([(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.8, 0.5)]):
        rewards, values, mask = _episode_batch(400 + seed)
        adv, returns = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma=gamma, lam=lam)
        cases.append(
            {
                "id": f"gae-{gamma}-{lam}",
                "verl": {"adv_estimator": "gae", "gamma": gamma, "lam": lam},
                "inputs": {"token_rewards": rewards.tolist(), "values": values.tolist(), "mask": mask.tolist()},
                "outputs": {"advantages": adv.tolist(), "returns": returns.tolist()},
            }
        )
    return cases


def _value_loss_cases():
    import torch
    from verl.trainer.ppo import core_algos

    cases = []
    for seed, (clip, agg) in enumerate(
        [(0.2, "token-mean"), (0.5, "token-mean"), (1e9, "token-mean"), (0.2, "seq-mean-token-mean")]
    ):
        g = torch.Generator().manual_seed(500 + seed)
        rows, width = 6, 8
        lengths = torch.randint(1, width + 1, (rows,), generator=g)
        lengths[rows // 2] = 0
        mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
        old = torch.randn(rows, width, generator=g, dtype=torch.float64)
        vpreds = old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.5
        returns = old + torch.randn(rows, width, generator=g, dtype=torch.float64)
        junk = torch.full_like(old, 3.0)
        old, vpreds, returns = (torch.where(mask > 0, x, junk) for x in (old, vpreds, returns))
        x = vpreds.clone().requires_grad_()
        loss, clipfrac = core_algos.compute_value_loss(x, returns, old, mask, cliprange_value=clip, loss_agg_mode=agg)
        loss.backward()
        clipfrac = float(clipfrac)
        if clip < 1e6 and not 0 < clipfrac < 1:
            raise RuntimeError(f"value loss case {clip}: vf_clipfrac is {clipfrac}; pick inputs that exercise it")
        cases.append(
            {
                "id": f"value_loss-{clip}-{agg}",
                "verl": {"cliprange_value": clip, "loss_agg_mode": agg},
                "inputs": {
                    "vpreds": vpreds.tolist(),
                    "values": old.tolist(),
                    "returns": returns.tolist(),
                    "mask": mask.tolist(),
                },
                "outputs": {"vf_loss": loss.item(), "vf_clipfrac": clipfrac, "grad": x.grad.tolist()},
            }
        )
    return cases


def _kl_controller_cases():
    from verl.trainer.ppo import core_algos

    # (current_kl, n_steps) after each batch: above, far above, below, far below and near the target
    updates = [(0.15, 256), (0.9, 256), (0.05, 512), (0.0, 128), (0.1, 64), (0.11, 1000), (0.3, 4096)]
    specs = [
        ("fixed", {"kl_coef": 0.001}),
        ("adaptive", {"init_kl_coef": 0.001, "target_kl": 0.1, "horizon": 10000}),
        ("adaptive", {"init_kl_coef": 0.05, "target_kl": 0.2, "horizon": 500}),
    ]
    cases = []
    for i, (kind, params) in enumerate(specs):
        if kind == "fixed":
            controller = core_algos.FixedKLController(**params)
        else:
            controller = core_algos.AdaptiveKLController(**params)
        coefs = []
        for current_kl, n_steps in updates:
            controller.update(current_kl=current_kl, n_steps=n_steps)
            coefs.append(float(controller.value))
        cases.append(
            {
                "id": f"kl_ctrl-{kind}-{i}",
                "verl": {"type": kind, **params},
                "inputs": {"updates": [list(u) for u in updates]},
                "outputs": {"coefs": coefs},
            }
        )
    return cases


def record(out: Path) -> None:
    import torch
    import verl

    torch.set_default_dtype(torch.float64)
    data = {
        "source": f"verl {verl.__version__}",
        "pins": PINS,
        "generated_by": "scripts/record_reference.py",
        "policy_losses": _policy_cases(),
        "advantages": _advantage_cases(),
        "kl": _kl_cases(),
        "corrections": _correction_cases(),
        "gae": _gae_cases(),
        "value_losses": _value_loss_cases(),
        "kl_controllers": _kl_controller_cases(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}: " + ", ".join(f"{len(v)} {k}" for k, v in data.items() if isinstance(v, list) and k != "pins"))


# ---------------------------------------------------------------------------------------------------------------
# Rollout correction (verl_rollout_corr.json): verl's rollout_corr_helper and TRL's off-policy sequence mask.


def install_rollout_corr(target: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), *ROLLOUT_CORR_PINS]
    subprocess.run(cmd, check=True)


def _mismatch_batch(seed: int, spread: float, *, rows: int = 8, width: int = 9):
    """float64 (old_train, old_rollout, mask, advantages): one empty response, finite junk at padding, a
    per-response advantage of either sign, and the training engine's log-probs ``spread`` away from the rollout's."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (rows,), generator=g)
    lengths[rows // 2] = 0
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    rollout = -(torch.rand(rows, width, generator=g, dtype=torch.float64) * 3.0 + 0.05)
    train = rollout + torch.randn(rows, width, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, width) * mask
    junk = torch.full_like(rollout, -1.0)
    return torch.where(mask > 0, train, junk), torch.where(mask > 0, rollout, junk - 0.5), mask, adv


def _batch_json(train, rollout, mask, adv=None) -> dict:
    out = {"old_train": train.tolist(), "old_rollout": rollout.tolist(), "mask": mask.tolist()}
    return out if adv is None else {**out, "advantages": adv.tolist()}


def _scalars(metrics: dict) -> dict:
    return {key.removeprefix("rollout_corr/"): float(value) for key, value in metrics.items()}


def _exercised(case_id: str, kept, valid) -> None:
    """A case must both keep and drop (or cap) some response tokens, else it proves nothing."""
    kept = kept[valid > 0]
    if kept.all() or not kept.any():
        raise RuntimeError(f"rollout correction case {case_id} keeps all or nothing; pick other inputs")


def _rollout_is_cases():
    from verl.trainer.ppo import rollout_corr_helper as rc

    cases = []
    specs = [
        ("token", 2.0, False, 0.6),
        ("token", "0.5_5.0", False, 0.9),
        ("token", 1.5, True, 0.6),
        ("sequence", 2.0, False, 0.4),
        ("sequence", "0.5_5.0", False, 0.5),
        ("sequence", 3.0, True, 0.4),
    ]
    for seed, (level, threshold, normalize, spread) in enumerate(specs):
        train, rollout, mask, _ = _mismatch_batch(600 + seed, spread)
        weights, metrics = rc.compute_rollout_correction_weights(
            train - rollout,
            mask,
            rollout_is=level,
            rollout_is_threshold=threshold,
            rollout_is_batch_normalize=normalize,
        )
        plain, _ = rc.compute_rollout_correction_weights(
            train - rollout, mask, rollout_is=level, rollout_is_threshold=threshold
        )
        raw, _ = rc.compute_rollout_correction_weights(
            train - rollout, mask, rollout_is=level, rollout_is_threshold=1e30
        )
        case_id = f"rollout_is-{level}-{threshold}" + ("-normalize" if normalize else "")
        _exercised(case_id, plain == raw, mask)
        cases.append(
            {
                "id": case_id,
                "verl": {
                    "rollout_is": level,
                    "rollout_is_threshold": threshold,
                    "rollout_is_batch_normalize": normalize,
                },
                "inputs": _batch_json(train, rollout, mask),
                "outputs": {"weights": weights.tolist(), "metrics": _scalars(metrics)},
            }
        )
    return cases


def _rollout_rs_cases():
    from verl.trainer.ppo import rollout_corr_helper as rc

    # one per option, thresholds that reject some of these inputs; then chains (every criterion must pass)
    specs = [
        ("token_k1", "0.7_1.3"),
        ("token_k1", 1.4),
        ("token_k2", 0.05),
        ("token_k3", 0.05),
        ("seq_sum_k1", "0.5_2.0"),
        ("seq_sum_k2", 0.3),
        ("seq_sum_k3", 0.3),
        ("seq_mean_k1", "0.9_1.1"),
        ("seq_mean_k2", 0.04),
        ("seq_mean_k3", 0.04),
        ("seq_max_k2", 0.2),
        ("seq_max_k3", 0.2),
        ("token_k1,seq_max_k3", "0.6_1.5,0.3"),
        ("seq_sum_k2,seq_mean_k1,token_k3", "0.6,0.85_1.2,0.1"),
        ("seq_mean_k1,token_k2", 1.25),
    ]
    cases = []
    for seed, (options, threshold) in enumerate(specs):
        train, rollout, mask, _ = _mismatch_batch(700 + seed, 0.3)
        kept, metrics = rc.compute_rollout_rejection_mask(
            train - rollout, mask, rollout_rs=options, rollout_rs_threshold=threshold
        )
        case_id = f"rollout_rs-{options}-{threshold}"
        _exercised(case_id, kept > 0, mask)
        cases.append(
            {
                "id": case_id,
                "verl": {"rollout_rs": options, "rollout_rs_threshold": threshold},
                "inputs": _batch_json(train, rollout, mask),
                "outputs": {"mask": kept.tolist(), "metrics": _scalars(metrics)},
            }
        )
    return cases


# verl's presets of RolloutCorrectionConfig whose correction the rollout correction computes (the bypass_pg_* ones
# change the policy loss, not the correction); the spread of each case's mismatch suits its thresholds
ROLLOUT_CORR_PRESETS = {
    "decoupled_token_is": 0.6,
    "decoupled_seq_is": 0.4,
    "decoupled_token_icepop": 0.9,
    "decoupled_seq_is_rs": 0.4,
    "decoupled_geo_rs": 0.002,
    "decoupled_geo_rs_seq_tis": 0.002,
    "decoupled_geo_rs_token_tis": 0.002,
    "decoupled_k3_rs": 0.15,
    "decoupled_k3_rs_seq_tis": 0.15,
    "decoupled_k3_rs_token_tis": 0.15,
    "bypass_ppo_clip_geo_rs": 0.002,
    "bypass_ppo_clip_k3_rs": 0.15,
}


def _rollout_corr_preset_cases():
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import rollout_corr_helper as rc

    cases = []
    for seed, (preset, spread) in enumerate(ROLLOUT_CORR_PRESETS.items()):
        config = getattr(RolloutCorrectionConfig, preset)()
        fields = {
            key: getattr(config, key)
            for key in (
                "rollout_is",
                "rollout_is_threshold",
                "rollout_is_batch_normalize",
                "rollout_rs",
                "rollout_rs_threshold",
                "bypass_mode",
                "loss_type",
            )
        }
        train, rollout, mask, _ = _mismatch_batch(800 + seed, spread)
        weights, kept, metrics = rc.compute_rollout_correction_and_rejection_mask(
            train, rollout, mask, **{k: v for k, v in fields.items() if k not in ("bypass_mode", "loss_type")}
        )
        weights = weights.batch["rollout_is_weights"] if weights is not None else None
        if fields["rollout_rs"] is not None:
            _exercised(preset, kept > 0, mask)
        cases.append(
            {
                "id": preset,
                "verl": fields,
                "inputs": _batch_json(train, rollout, mask),
                "outputs": {
                    "weights": None if weights is None else weights.tolist(),
                    "mask": kept.tolist(),
                    "metrics": _scalars(metrics),
                },
            }
        )
    return cases


def _trl_opsm_cases():
    import torch
    from trl.trainer.grpo_trainer import GRPOTrainer

    cases = []
    for seed, (threshold, per_token) in enumerate([(0.05, False), (0.2, False), (0.05, True)]):
        train, rollout, mask, adv = _mismatch_batch(900 + seed, 0.4)
        if per_token:  # per-token advantages (a process reward): the sign may change inside a response
            g = torch.Generator().manual_seed(950 + seed)
            adv = torch.randn(adv.shape, generator=g, dtype=torch.float64) * mask
        kept = GRPOTrainer.get_off_policy_mask(
            advantages=adv if per_token else adv[:, :1],
            per_token_logps=train,
            sampling_per_token_logps=rollout,
            mask=mask,
            off_policy_threshold=threshold,
        )
        kept = kept.expand_as(mask)
        case_id = f"opsm-{threshold}" + ("-per-token" if per_token else "")
        _exercised(case_id, kept > 0, mask)
        cases.append(
            {
                "id": case_id,
                "trl": {"off_policy_mask_threshold": threshold},
                "inputs": _batch_json(train, rollout, mask, adv),
                "outputs": {"mask": kept.tolist()},
            }
        )
    return cases


def record_rollout_corr(out: Path) -> None:
    import torch
    import trl
    import verl

    torch.set_default_dtype(torch.float64)
    data = {
        "source": f"verl {verl.__version__}, trl {trl.__version__}",
        "pins": PINS + ROLLOUT_CORR_PINS,
        "generated_by": "scripts/record_reference.py (record_rollout_corr)",
        "rollout_is": _rollout_is_cases(),
        "rollout_rs": _rollout_rs_cases(),
        "presets": _rollout_corr_preset_cases(),
        "trl_opsm": _trl_opsm_cases(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}: " + ", ".join(f"{len(v)} {k}" for k, v in data.items() if isinstance(v, list) and k != "pins"))


def _policy_cases_2026():
    """verl's dppo_tv, dppo_kl and dro through get_policy_loss_fn, as _policy_case records the others."""
    tv = {"clip_ratio": 0.15, "clip_ratio_low": 0.15, "clip_ratio_high": 0.15}
    kl = {"clip_ratio": 0.05, "clip_ratio_low": 0.05, "clip_ratio_high": 0.05}
    cases = [
        _policy_case("dppo_tv-token-mean", "dppo_tv", "token-mean", {**tv, "clip_ratio_c": 1.5}, 40, spread=0.5),
        _policy_case(
            "dppo_tv-asym-seq-mean-token-sum-norm",
            "dppo_tv",
            "seq-mean-token-sum-norm",
            {"clip_ratio": 0.1, "clip_ratio_low": 0.05, "clip_ratio_high": 0.2, "clip_ratio_c": 20.0},
            41,
            spread=0.6,
        ),
        _policy_case("dppo_kl-token-mean", "dppo_kl", "token-mean", {**kl, "clip_ratio_c": 1.5}, 42, spread=0.5),
        _policy_case(
            "dppo_kl-asym-seq-mean-token-mean",
            "dppo_kl",
            "seq-mean-token-mean",
            {"clip_ratio": 0.05, "clip_ratio_low": 0.02, "clip_ratio_high": 0.08, "clip_ratio_c": 20.0},
            43,
            empty_row=False,
            spread=0.6,
        ),
        _policy_case("dro-token-mean", "dro", "token-mean", {"policy_loss": {"dro_beta": 0.1}}, 44, spread=0.5),
        _policy_case("dro-seq-mean-token-sum", "dro", "seq-mean-token-sum", {"policy_loss": {"dro_beta": 0.5}}, 45),
    ]
    for case in cases:  # every trust region drops some tokens and keeps others; the c = 1.5 cases truncate weights
        out = case["outputs"]
        if case["id"].startswith("dppo") and not 0 < out["pg_clipfrac"] < 1:
            raise RuntimeError(f"case {case['id']}: pg_clipfrac is {out['pg_clipfrac']}; pick inputs that exercise it")
        if case["id"] in {"dppo_tv-token-mean", "dppo_kl-token-mean"} and not out["pg_clipfrac_lower"] > 0:
            raise RuntimeError(f"case {case['id']}: no weight was truncated; pick inputs that exercise it")
    return cases


def _vespo_cases():
    """TRL's own VESPO weights (GRPOTrainer.get_gamma_weights, a static method on plain tensors); the loss is TRL's
    formula around them, -phi * A * logp summed over valid tokens / their count (loss_type="vespo", one process)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    cases = []
    for seed, (spread, params) in enumerate(
        [(0.3, {}), (0.15, {"k_pos": 1.0, "lambda_pos": 1.5, "k_neg": 4.0, "lambda_neg": 3.0})]
    ):
        logp, old, adv, mask = _inputs(60 + seed, spread=spread)
        x = logp.clone().requires_grad_()
        phi = GRPOTrainer.get_gamma_weights(adv[:, :1], x - old, mask, None, **params)  # [B, 1], no gradient
        loss = (-phi * adv[:, :1] * x * mask).sum() / mask.sum().clamp(min=1.0)
        loss.backward()
        cases.append(
            {
                "id": f"vespo-{seed}",
                "trl": {"loss_type": "vespo", "params": params},
                "inputs": {
                    "logp": logp.tolist(),
                    "old_logp": old.tolist(),
                    "advantages": adv.tolist(),
                    "mask": mask.tolist(),
                },
                "outputs": {"phi": phi.flatten().tolist(), "loss": loss.item(), "grad": x.grad.tolist()},
            }
        )
    return cases


def _left_aligned(seed: int, rows: int, width: int, empty: tuple[int, ...] = ()):
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    lengths[list(empty)] = 0
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    return g, lengths, mask


def _advantage_cases_2026():
    import numpy as np
    import torch
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos

    cases = []

    def add(case_id, name, params, inputs, adv, returns=None):
        outputs = {"advantages": adv.tolist(), **({"returns": returns.tolist()} if returns is not None else {})}
        cases.append(
            {"id": case_id, "verl": {"adv_estimator": name, "params": params}, "inputs": inputs, "outputs": outputs}
        )

    # remax: token rewards (the outcome at the last token, a small dense term) and one greedy baseline per response
    rewards, index, mask, token_rewards = _reward_batch(700)
    g = torch.Generator().manual_seed(701)
    token_rewards = token_rewards + torch.randn(token_rewards.shape, generator=g, dtype=torch.float64) * 0.05 * mask
    baselines = torch.rand(len(rewards), generator=g, dtype=torch.float64)
    adv, returns = core_algos.get_adv_estimator_fn("remax")(token_rewards, baselines, mask, config=AlgoConfig())
    add(
        "remax",
        "remax",
        {},
        {
            "token_rewards": token_rewards.tolist(),
            "reward_baselines": baselines.tolist(),
            "mask": mask.tolist(),
            "group_index": index.tolist(),
        },
        adv,
        returns,
    )

    # grpo_passk: graded rewards, then binary ones with a tie for the best in a group
    binary = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    for seed, (graded, std) in enumerate([(True, True), (True, False), (False, True)]):
        rewards, index, mask, _ = _reward_batch(710 + seed)
        if not graded:
            rewards = binary
        token_rewards = torch.zeros_like(mask)
        token_rewards[torch.arange(len(rewards)), mask.sum(-1).long() - 1] = rewards
        config = AlgoConfig(norm_adv_by_std_in_grpo=std)
        adv, _ = core_algos.get_adv_estimator_fn("grpo_passk")(token_rewards, mask, index, config=config)
        inputs = {"rewards": rewards.tolist(), "group_index": index.tolist(), "mask": mask.tolist()}
        add(f"grpo_passk-{seed}", "grpo_passk", {"norm_adv_by_std_in_grpo": std}, inputs, adv)

    # gdpo: three reward parts of float32-exact values (verl reads parts as float32), per-part weights
    for seed, std in enumerate([True, False]):
        rows, width, prompt = 8, 6, 3
        g, lengths, mask = _left_aligned(720 + seed, rows, width)
        index = np.array([i // 4 for i in range(rows)])
        parts = {
            "correct": (torch.rand(rows, generator=g) > 0.5).double(),
            "format": torch.randint(0, 5, (rows,), generator=g).double() / 4.0,
            "length": -torch.randint(0, 9, (rows,), generator=g).double() / 8.0,
        }
        parts["correct"][0], parts["correct"][1] = 0.0, 1.0  # group 0 varies in every part
        keys, weights = list(parts), [1.0, 0.5, 2.0]
        attention = torch.cat([torch.ones(rows, prompt), mask], 1).long()  # verl indexes with its sums
        batch = {"prompts": torch.zeros(rows, prompt, dtype=torch.long), "attention_mask": attention}
        config = AlgoConfig(norm_adv_by_std_in_grpo=std, gdpo_reward_keys=keys, gdpo_reward_weights=weights)
        adv, _ = core_algos.get_adv_estimator_fn("gdpo")(
            torch.zeros_like(mask),
            mask,
            index,
            norm_adv_by_std_in_grpo=std,
            config=config,
            non_tensor_batch={k: v.numpy() for k, v in parts.items()},
            batch=batch,
        )
        inputs = {
            "parts": {k: v.tolist() for k, v in parts.items()},
            "group_index": index.tolist(),
            "mask": mask.tolist(),
        }
        add(
            f"gdpo-{seed}",
            "gdpo",
            {"gdpo_reward_keys": keys, "gdpo_reward_weights": weights, "norm_adv_by_std_in_grpo": std},
            inputs,
            adv,
        )

    # optimal token baselines: left-aligned responses (groups of 4, 4 and 1, an empty response), then holes
    def otb_inputs(g, mask):
        old = -(torch.rand(mask.shape, generator=g, dtype=torch.float64) * 3.0 + 0.02)
        pi = torch.exp(old)
        sum_pi_squared = pi * pi + torch.rand(mask.shape, generator=g, dtype=torch.float64) * (1.0 - pi) ** 2
        return old, sum_pi_squared

    g, lengths, mask = _left_aligned(730, 9, 7, empty=(5,))
    index = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2])
    outcome = torch.rand(9, generator=g, dtype=torch.float64)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(9), (lengths - 1).clamp(min=0)] = outcome * (lengths > 0)
    old, spi = otb_inputs(g, mask)
    hole_rewards, _, holes = _episode_batch(731)  # holes inside responses, a fully masked row
    hole_index = np.array([0, 0, 0, 1, 1, 1, 2])
    hole_old, hole_spi = otb_inputs(torch.Generator().manual_seed(732), holes)
    for data_id, (tr, m, idx, lp, s2) in {
        "aligned": (token_rewards, mask, index, old, spi),
        "holes": (hole_rewards, holes, hole_index, hole_old, hole_spi),
    }.items():
        for name in ["optimal_token_baseline", "tir_optimal_token_baseline"]:
            for zero_tail in [True, False]:
                adv, returns = core_algos.get_adv_estimator_fn(name)(
                    tr, m, idx, old_log_probs=lp, sum_pi_squared=s2, handle_zero_tail=zero_tail
                )
                inputs = {
                    "token_rewards": tr.tolist(),
                    "mask": m.tolist(),
                    "group_index": idx.tolist(),
                    "old_logprobs": lp.tolist(),
                    "sum_pi_squared": s2.tolist(),
                }
                add(f"{name}-{data_id}-{zero_tail}", name, {"handle_zero_tail": zero_tail}, inputs, adv, returns)
    return cases


def record_2026(out: Path) -> None:
    import torch
    import trl
    import verl

    torch.set_default_dtype(torch.float64)
    data = {
        "source": f"verl {verl.__version__}, trl {trl.__version__}",
        "pins": PINS + PINS_2026,
        "generated_by": "scripts/record_reference.py (record_2026)",
        "policy_losses": _policy_cases_2026(),
        "vespo": _vespo_cases(),
        "advantages": _advantage_cases_2026(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}: " + ", ".join(f"{len(v)} {k}" for k, v in data.items() if isinstance(v, list) and k != "pins"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--target", type=Path, help="folder for the pinned wheels (default: a temporary one)")
    parser.add_argument("--rollout-corr-out", type=Path, default=ROLLOUT_CORR_OUT)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        record(args.out)
        record_rollout_corr(args.rollout_corr_out)
        record_2026(args.out.with_name(OUT_2026.name))
        return
    with tempfile.TemporaryDirectory(prefix="rlzoo-reference-") as tmp:
        target = args.target or Path(tmp)
        if not (target / "verl").is_dir():
            install(target)
        if not (target / "trl").is_dir():
            install_rollout_corr(target)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
        env["VERL_USE_EXTERNAL_PLUGINS"] = "none"  # only verl's own code
        outs = ["--out", str(args.out.resolve()), "--rollout-corr-out", str(args.rollout_corr_out.resolve())]
        subprocess.run([sys.executable, __file__, "--inside", *outs], check=True, env=env)


if __name__ == "__main__":
    main()
