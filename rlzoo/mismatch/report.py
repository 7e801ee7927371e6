"""What ``rlzoo mismatch`` writes: ``mismatch.json`` (every number), ``mismatch.md`` (the same as tables),
``mismatch.png`` (the gap's histogram, by position, by probability, MoE router disagreement per layer) and the
console summary (one screen)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from rlzoo.mismatch.corrections import compare_corrections, recommend
from rlzoo.mismatch.gradients import REFERENCE
from rlzoo.mismatch.measures import by_position, by_probability, gap_metrics
from rlzoo.mismatch.session import Measured
from rlzoo.util.atomic import atomic_write_text


def _rates(flips: dict[int, list[int]]) -> dict[str, float]:
    return {str(layer): (d / n if n else 0.0) for layer, (d, n) in sorted(flips.items())}


def _overall(flips: dict[int, list[int]]) -> float:
    differ, slots = (sum(c[i] for c in flips.values()) for i in (0, 1))
    return differ / slots if slots else 0.0


def build_result(measured: Measured, corrections: dict[str, Any], about: dict[str, Any]) -> dict[str, Any]:
    """Every number of the report: the gap (``metrics``, which ``--fail-above`` reads), its breakdowns, the MoE
    router disagreement, each correction's effect and the recommendation; ``about`` says what was measured."""
    m = measured
    metrics = gap_metrics(m.train, m.rollout, m.mask)
    moe = None
    if m.router_policy is not None:
        moe = {
            "router_policy": m.router_policy,
            "replays_old_pass": m.replays_old_pass,
            "disagreement_per_layer": _rates(m.flips),
            "disagreement_per_layer_with_policy": _rates(m.flips_policy),
        }
        if m.flips:
            metrics["router_disagreement"] = _overall(m.flips)
        if m.fresh is not None:
            metrics["abs_logp_diff_no_replay"] = gap_metrics(m.fresh, m.rollout, m.mask)["abs_logp_diff"]
    effects = compare_corrections(corrections, m.train, m.rollout, m.mask, m.advantages)
    gradients = {**m.gradients_about, "reference": (m.gradients or {}).get(REFERENCE)}
    for name, effect in effects.items():  # beside the weights' numbers: the gradient's
        effect.update((m.gradients or {}).get(name, {}))
    machine = {"cpus": os.cpu_count(), "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    return {
        **about,
        "batches": m.batches,
        "skipped_batches": m.skipped,
        "seconds": round(m.seconds, 2),
        "machine": machine,
        "metrics": metrics,
        "by_position": by_position(m.train, m.rollout, m.mask),
        "by_probability": by_probability(m.train, m.rollout, m.mask),
        "moe": moe,
        "corrections": effects,
        "gradients": gradients if m.gradients is not None or m.gradients_about else None,
        "recommendation": recommend(effects, metrics.get("abs_logp_diff", math.nan)),
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]


def markdown(result: dict[str, Any]) -> str:
    """``mismatch.md``: what was measured, the gap, its breakdowns, the router disagreement, the corrections."""
    r, m = result, result["metrics"]
    engines = r["engines"]
    lines = [
        f"# Train-inference mismatch: {r['config']}",
        "",
        f"rollout engine **{engines['rollout']}** ({engines['rollout_dtype']}) vs training engine "
        f"**{engines['trainer']}** ({engines['trainer_dtype']}), same weights, no update; {r['batches']} batch(es), "
        f"{int(m['tokens'])} response tokens of {int(m['responses'])} responses; {r['seconds']} s on "
        f"{r['machine']['cpus']} CPUs (1-min load {_fmt(r['machine']['load_1min'])}). d = log pi_train - log pi_rollout "
        "of each sampled token (docs/mismatch.md says what each number means).",
        "",
        "## The gap",
        "",
        *_table([{"metric": k, "value": v} for k, v in m.items()], ["metric", "value"]),
        "",
        "## By position in the response",
        "",
        *_table(r["by_position"], ["bin", "tokens", "share", "abs_logp_diff", "abs_logp_diff_max"]),
        "",
        "## By the rollout engine's probability of the token",
        "",
        *_table(r["by_probability"], ["bin", "tokens", "share", "abs_logp_diff", "abs_logp_diff_max"]),
        "",
    ]
    moe = r["moe"]
    if moe is not None:
        layers = sorted(set(moe["disagreement_per_layer"]) | set(moe["disagreement_per_layer_with_policy"]), key=int)
        rows = [
            {
                "layer": layer,
                "routed afresh": moe["disagreement_per_layer"].get(layer, math.nan),
                f"with {moe['router_policy']}": moe["disagreement_per_layer_with_policy"].get(layer, math.nan),
            }
            for layer in layers
        ]
        lines += [
            "## MoE router disagreement (share of expert slots the training engine chose differently)",
            "",
            f"router policy: {moe['router_policy']} (replays in the old pass: {moe['replays_old_pass']})",
            "",
        ]
        columns = ["layer", "routed afresh"] + ([f"with {moe['router_policy']}"] if moe["replays_old_pass"] else [])
        lines += [*_table(rows, columns), ""] if rows else ["(the rollout engine recorded no experts)", ""]
    if r.get("causes"):
        lines += [
            "## Causes (one thing changed at a time)",
            "",
            *_table(
                r["causes"],
                ["cause", "changed", "abs_logp_diff", "baseline", "explains", "adds", "alone_vs_batched", "grad_norm"],
            ),
            "",
        ]
    rows = [{"correction": n, **e} for n, e in r["corrections"].items()]
    rec = r["recommendation"]
    lines += [
        "## Which correction pays",
        "",
        *_table(rows, ["correction", "kept", "reweighted", "ess", "mean", "var", "residual", *GRADIENT_COLUMNS]),
        "",
        *_gradients_note(r.get("gradients")),
        f"**Recommended: {rec['name'] or 'none of them'}** ({rec['reason']}).",
        "",
        f"Rule: {rec['rule']}.",
        "",
    ]
    lines += [f"Not measured: {name} ({why})." for name, why in r.get("corrections_not_built", {}).items()]
    return "\n".join(lines)


GRADIENT_COLUMNS = ["bias", "bias_noise", "grad_var", "cosine", "mse"]


def _gradients_note(gradients: dict[str, Any] | None) -> list[str]:
    """What the gradient columns were measured on (docs/mismatch.md), or why they are empty."""
    if not gradients:
        return []
    if "unavailable" in gradients:
        return [f"Gradients not measured: {gradients['unavailable']}.", ""]
    reference = gradients.get("reference") or {}
    return [
        f"Gradients: each correction's policy gradient against the on-policy one (exact sequence importance "
        f"weights, old = the trainer's log-probs) over {gradients['minibatches']} minibatches, cut as a step cuts "
        f"them; all {gradients['parameters']} trained parameters, CountSketch to {gradients['sketch_dim']} numbers "
        f"(seed {gradients['sketch_seed']}). bias and cosine of the mean gradient, grad_var of one minibatch's "
        f"(relative to the on-policy mean's squared norm); mse = bias^2 + grad_var / {gradients['horizon']}, the "
        f"run's optimizer steps (the bias repeats at every step, the noise averages out); the on-policy gradient's "
        f"own grad_var: {_fmt(reference.get('grad_var'))}.",
        "",
    ]


def plot(measured: Measured, result: dict[str, Any], path: Path) -> Path:
    """``mismatch.png``: |d| histogram, by position, by probability, and per MoE layer when measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    moe = result["moe"]
    panels = 4 if moe is not None and moe["disagreement_per_layer"] else 3
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4))
    d = (measured.train.double() - measured.rollout.double())[measured.mask > 0].abs()
    axes[0].hist(torch.log10(d.clamp(min=1e-12)).numpy(), bins=40)
    axes[0].set(title="per-token |d|", xlabel="log10 |log pi_train - log pi_rollout|", ylabel="tokens")
    for ax, key, title in (
        (axes[1], "by_position", "by response position"),
        (axes[2], "by_probability", "by pi_rollout of the token"),
    ):
        rows = result[key]
        ax.bar(range(len(rows)), [0.0 if math.isnan(x["abs_logp_diff"]) else x["abs_logp_diff"] for x in rows])
        ax.set_xticks(range(len(rows)), [x["bin"] for x in rows], rotation=45, fontsize=7)
        ax.set(title=title, ylabel="mean |d|")
    if panels == 4:
        layers = list(moe["disagreement_per_layer"])
        ticks = range(len(layers))
        axes[3].bar(ticks, list(moe["disagreement_per_layer"].values()), label="routed afresh")
        if moe["disagreement_per_layer_with_policy"]:
            axes[3].plot(
                ticks,
                [moe["disagreement_per_layer_with_policy"].get(x, 0.0) for x in layers],
                "ro",
                label=f"with {moe['router_policy']}",
            )
        axes[3].set_xticks(ticks, layers)
        axes[3].set_ylim(0, 1.15 * max([0.01, *moe["disagreement_per_layer"].values()]))
        axes[3].set(title="router disagreement per MoE layer", xlabel="layer", ylabel="share of expert slots")
        axes[3].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(measured: Measured, result: dict[str, Any], out: Path) -> list[Path]:
    """The report's three files in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "mismatch.json", json.dumps(result, indent=2, allow_nan=True) + "\n")
    atomic_write_text(out / "mismatch.md", markdown(result))
    return [out / "mismatch.md", out / "mismatch.json", plot(measured, result, out / "mismatch.png")]


def summary(result: dict[str, Any]) -> list[str]:
    """The console's few lines: the gap, its tails, the router, the recommendation."""
    m, rec = result["metrics"], result["recommendation"]
    shares = ", ".join(f">{k.removeprefix('share_above_')}: {m[k]:.2%}" for k in m if k.startswith("share_above_"))
    lines = [
        f"  tokens     {int(m['tokens'])} in {int(m['responses'])} responses, {result['batches']} batch(es)",
        f"  |d| mean   {m['abs_logp_diff']:.3g} (median {m['abs_logp_diff_p50']:.3g}, p99 {m['abs_logp_diff_p99']:.3g}, "
        f"max {m['abs_logp_diff_max']:.3g})",
        f"  KL         k1 {m['k1_kl']:.3g}, k3 {m['k3_kl']:.3g}; chi2 token {m['chi2_token']:.3g}, seq {m['chi2_seq']:.3g}",
        f"  tokens |d| {shares}",
    ]
    if "router_disagreement" in m:
        lines.append(f"  router     {m['router_disagreement']:.2%} of expert slots differ (routed afresh)")
    if "abs_logp_diff_no_replay" in m:
        lines.append(
            f"  replay     |d| mean {m['abs_logp_diff']:.3g} with {result['moe']['router_policy']}, "
            f"{m['abs_logp_diff_no_replay']:.3g} routed afresh"
        )
    lines += _corrections_lines(result)
    lines += _causes_lines(result.get("causes") or [])
    lines.append(f"  correction {rec['name'] or 'none of them'}: {rec['reason']}")
    return lines


def _corrections_lines(result: dict[str, Any]) -> list[str]:
    """One line per correction: kept, ESS and, when measured, the gradient's bias, variance and cosine."""
    gradients = result.get("gradients") or {}
    graded = "minibatches" in gradients
    head = f"  {'':<11}{'kept':>7} {'ESS':>6}" + (
        f" {'bias':>9} {'± noise':>9} {'var':>7} {'cosine':>8}   (gradient vs on-policy, "
        f"{gradients['minibatches']} minibatches)"
        if graded
        else ""
    )
    lines = [head]
    for name, e in result["corrections"].items():
        line = f"  {name[:10]:<11}{e['kept']:>7.1%} {e['ess']:>6.3f}"
        if graded:
            numbers = (e.get(k, math.nan) for k in ("bias", "bias_noise", "grad_var", "cosine"))
            line += " {:>9.3g} {:>9.2g} {:>7.3g} {:>8.5f}".format(*numbers)
        lines.append(line)
    return lines


def _causes_lines(causes: list[dict[str, Any]]) -> list[str]:
    """The causes table in two lines: each one-change cause's share of the gap, and what staleness adds."""
    changes = [c for c in causes if "k" not in c]
    stale = [c for c in causes if "k" in c]
    lines = []
    if changes:
        lines.append("  causes     explains " + ", ".join(f"{c['cause']} {c['explains']:.2f}" for c in changes))
    if stale:
        lines.append(
            "  staleness  |d| mean "
            + ", ".join(f"k={c['k']} {c['abs_logp_diff']:.3g} (adds {c['adds']:+.3g})" for c in stale)
            + f" against {stale[0]['baseline']:.3g} at k=0"
        )
    return lines
