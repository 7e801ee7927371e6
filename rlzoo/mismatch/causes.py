"""``rlzoo mismatch --causes``: the gap measured again with one thing changed at a time.

    precision (rollout)   the rollout engine in the other dtype (model.dtype: float32 <-> bfloat16)
    precision (trainer)   the training engine in the other dtype (trainer.dtype: fp32, or bf16 autocast)
    batch composition     each response of the first batch scored by the training engine alone (a batch of one)
                          instead of in the full batch; its gap to the rollout, and to the batched score
    routing (MoE)         the config's router policy off (routed afresh) when it replays experts in the old pass
                          (from the same measurement); else, when the rollout engine records experts, the first
                          registered router policy that replays the rollout's experts (R3) on
    engine                the reference rollout engine (the default, transformers generate) on the same weights,
                          for a config that samples with another (e.g. vLLM); the core names no engine
    staleness (k)         the trainer k = 1, 2 real updates of the config's algorithm ahead of the rollout engine
                          (from the baseline's own run, :mod:`rlzoo.mismatch.session`): the measured batches scored
                          again by the updated trainer, against the rollout engine's log-probs of the same tokens

Each changed measurement samples the same prompts with the same seeds (a dtype change may still sample other
tokens). With ``G0`` the baseline's mean |d| and ``G1`` the changed one's, ``explains = |G0 - G1| / max(G0, G1)``:
the share of the larger of the two gaps that the one change accounts for (1: it makes the whole gap, or removes
it; 0: no effect), and ``adds = G1 - G0`` (what the change adds to the mean |d|; negative: it removes some).
Batch composition's ``G1`` is the alone-scored gap on the first batch's rows and its ``G0`` the batched gap on the
same rows. Staleness's ``G1`` is ``mean |log pi_train_k - log pi_rollout|``: the gap a batch sampled k versions
ago meets (``rollout.max_staleness: k``), precision included, so ``explains`` near 1 says staleness dwarfs it; its
``grad_norm`` is update k's mean gradient norm (0: its batch held no learning signal, so the weights did not move).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlzoo.config.base import DEFAULT_ROLLOUT_ENGINE, SPECS
from rlzoo.config.schema import RunConfig
from rlzoo.errors import RlzooError
from rlzoo.mismatch.measures import gap_metrics
from rlzoo.mismatch.session import Measured, measure_config
from rlzoo.registry import Registry

OTHER_DTYPE = {"float32": "bfloat16", "bfloat16": "float32"}
STALENESS = (1, 2)  # the versions behind measured (k real updates of the trainer)


def _gap(train: Any, rollout: Any, mask: Any) -> float:
    return gap_metrics(train, rollout, mask).get("abs_logp_diff", float("nan"))


def _row(cause: str, changed: str, g1: float, g0: float) -> dict[str, Any]:
    larger = max(g0, g1)
    return {
        "cause": cause,
        "changed": changed,
        "abs_logp_diff": g1,
        "baseline": g0,
        "explains": abs(g0 - g1) / larger if larger > 0 else 0.0,
        "adds": g1 - g0,
    }


def causes_count(config: RunConfig, registry: Registry) -> int:
    """How many measurements :func:`measure_causes` may run (for the progress bar; the staleness updates are the
    baseline's: ``max(STALENESS)`` ticks more)."""
    return 3 + (1 if _other_engine(config) is not None else 0)


def _replaying_policy(registry: Registry) -> str | None:
    """The first registered router policy (by name) that replays the rollout engine's experts in the old pass."""
    for name in registry.names("router"):
        try:
            policy = registry.create("router", name)
        except RlzooError:
            continue
        if policy.needs_rollout_routing():
            return name
    return None


def _routing_row(
    config: RunConfig, registry: Registry, steps: int, baseline: Measured, tick: Callable[[int], None]
) -> dict[str, Any] | None:
    """The routing cause of an MoE policy (module docstring); ``None`` for a dense one or where it cannot be
    measured."""
    g0 = _gap(baseline.train, baseline.rollout, baseline.mask)
    if baseline.router_policy is None:
        return None
    if baseline.fresh is not None:
        return _row(
            "routing",
            f"router {baseline.router_policy} off (routed afresh)",
            _gap(baseline.fresh, baseline.rollout, baseline.mask),
            g0,
        )
    name = _replaying_policy(registry)
    if name is None or not baseline.flips:  # no such policy, or the rollout engine records no experts
        return None
    spec = SPECS["router"](name=name)
    changed = measure_config(_with(config, "algorithm", router=spec), registry, steps, tick)
    return _row(
        "routing",
        f"router {baseline.router_policy} -> {name} (the rollout's experts replayed)",
        _gap(changed.train, changed.rollout, changed.mask),
        g0,
    )


def _other_engine(config: RunConfig) -> dict[str, Any] | None:
    """The reference rollout engine (the default one, transformers ``generate``) for a config that samples with
    another; ``None`` when it samples with the reference already (measure another engine against it by running the
    command with ``--set rollout.engine=...``)."""
    if config.rollout.engine.name == DEFAULT_ROLLOUT_ENGINE:
        return None
    return {"name": DEFAULT_ROLLOUT_ENGINE}


def _with(config: RunConfig, section: str, **update: Any) -> RunConfig:
    return config.model_copy(update={section: getattr(config, section).model_copy(update=update)})


def measure_causes(
    config: RunConfig,
    registry: Registry,
    steps: int,
    baseline: Measured,
    tick: Callable[[int], None] = lambda n: None,
) -> list[dict[str, Any]]:
    """The table of the module docstring (``config`` is the measurement's, ``baseline`` its measurement)."""
    g0 = _gap(baseline.train, baseline.rollout, baseline.mask)
    rows = []
    for cause, section in (("precision (rollout)", "model"), ("precision (trainer)", "trainer")):
        dtype = getattr(config, section).dtype
        changed = measure_config(_with(config, section, dtype=OTHER_DTYPE[dtype]), registry, steps, tick)
        rows.append(
            _row(
                cause,
                f"{section}.dtype {dtype} -> {OTHER_DTYPE[dtype]}",
                _gap(changed.train, changed.rollout, changed.mask),
                g0,
            )
        )
    if baseline.alone is not None:
        n = baseline.alone.shape[0]
        batched, alone = baseline.alone_batched, baseline.alone
        rows.append(
            _row(
                "batch composition",
                f"each of {n} responses scored alone",
                _gap(alone, baseline.rollout[:n], baseline.mask[:n]),
                _gap(batched, baseline.rollout[:n], baseline.mask[:n]),
            )
        )
        rows[-1]["alone_vs_batched"] = _gap(alone, batched, baseline.mask[:n])
    routing = _routing_row(config, registry, steps, baseline, tick)
    rows += [routing] if routing is not None else []
    engine = _other_engine(config)
    if engine is not None:
        swapped = _with(config, "rollout", engine=config.rollout.engine.model_validate(engine))
        changed = measure_config(swapped, registry, steps, tick)
        rows.append(
            _row(
                "engine",
                f"rollout {config.rollout.engine.name} -> {engine['name']}",
                _gap(changed.train, changed.rollout, changed.mask),
                g0,
            )
        )
    return rows + staleness_rows(baseline)


def staleness_rows(baseline: Measured) -> list[dict[str, Any]]:
    """One row per k of ``baseline.stale`` (module docstring), with its ``k``."""
    g0, rows = _gap(baseline.train, baseline.rollout, baseline.mask), []
    for k, stale in sorted(baseline.stale.items()):
        ahead = f"the trainer {k} update{'s' if k > 1 else ''} ahead (real steps of the config's algorithm)"
        norms = [baseline.stale_grad_norm.get(j, 0.0) for j in range(1, k + 1)]
        if not any(norms):  # the weights did not move: say so rather than report staleness as harmless
            ahead += "; no update had a gradient (in each update batch, every group's rewards were equal)"
        row = _row(f"staleness (k={k})", ahead, _gap(stale, baseline.rollout, baseline.mask), g0)
        rows.append({**row, "k": k, "grad_norm": norms[-1]})
    return rows
