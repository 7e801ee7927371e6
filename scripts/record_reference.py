"""Record reference outputs of verl's own loss, advantage, KL and correction functions as rlzoo test data.

    python scripts/record_reference.py [--out estimators/tests/reference/verl.json] [--target DIR]

The pinned wheels (``PINS``) are installed with ``pip install --no-deps --target`` into a throwaway folder (a
temporary one unless ``--target`` names one), never into the environment and never as a project dependency. The
script then re-runs itself in a subprocess with that folder first on ``PYTHONPATH`` and calls verl's functions on
float64 tensors: ``core_algos.get_policy_loss_fn`` (loss, gradient w.r.t. the log-probs, clip fractions),
``core_algos.agg_loss``, the advantage estimators, ``kl_penalty`` and
``rollout_corr_helper.compute_rollout_correction_weights``. Nothing of verl is stubbed. The output is JSON, every
float written with Python's shortest round-trip repr, so the float64 values come back bit-exact.
``estimators/tests/test_estimators_reference.py`` feeds the same inputs to rlzoo's components.

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
            "geo_mean", "geo_mean", "seq-mean-token-mean", {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}, 16,
            empty_row=False, spread=0.5,
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
                        "old_train": old_train.tolist(), "old_rollout": old_rollout.tolist(), "mask": mask.tolist()
                    },
                    "outputs": {"weights": weights.tolist()},
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
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}: " + ", ".join(f"{len(v)} {k}" for k, v in data.items() if isinstance(v, list) and k != "pins"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--target", type=Path, help="folder for the pinned wheels (default: a temporary one)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        record(args.out)
        return
    with tempfile.TemporaryDirectory(prefix="rlzoo-reference-") as tmp:
        target = args.target or Path(tmp)
        if not (target / "verl").is_dir():
            install(target)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
        env["VERL_USE_EXTERNAL_PLUGINS"] = "none"  # only verl's own code
        subprocess.run([sys.executable, __file__, "--inside", "--out", str(args.out.resolve())], check=True, env=env)


if __name__ == "__main__":
    main()
