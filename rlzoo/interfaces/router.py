"""Router policies: which experts an MoE model uses in the forward passes of one rollout batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from rlzoo.interfaces.base import Component

if TYPE_CHECKING:
    from rlzoo.interfaces.run_facts import Problem, RunFacts
    from rlzoo.moe import Routing

RoutingSource = Literal["none", "old", "rollout"]


@dataclass(frozen=True)
class RecordedRouting:
    """The experts recorded for one rollout batch, aligned with the training batch's rows and positions.

    ``old``:     the training engine's old-log-prob pass (``None`` while that pass is being decided).
    ``rollout``: what the rollout engine used while sampling (``None`` when the engine does not record it).
    Each is a ``rlzoo.moe.Routing`` of ``[rows, positions, layers, top_k]`` expert indices of the whole batch.
    """

    old: Routing | None
    rollout: Routing | None


class RouterPolicy(Component):
    """Decides, per forward pass of a rollout batch, which recorded experts each MoE layer replays.

    The loop asks twice per rollout batch:

    - :meth:`old_pass_routing` before the old-log-prob pass (``recorded.old`` is ``None`` then);
    - :meth:`update_routing` once that pass is recorded; the answer is replayed in every update pass (the loop
      selects each minibatch's rows).

    Each answer is a ``rlzoo.moe.Routing`` or ``None``. A routing over a subset of the model's MoE layers
    (``Routing.only_layers``) replays those layers and lets the others route afresh; ``None`` routes every
    layer afresh. Under replay the chosen experts are fixed but the gate weights are the current router's
    softmax at those experts (renormalised as the model does), so the router still gets gradient. The core
    (``rlzoo.moe``) does the mechanics and logs ``moe/flip_rate`` and ``moe/flip_rate/layer_N`` against the
    old pass's experts whatever the policy.

    A policy written before these methods existed declares only ``source`` (``"none"``, ``"old"`` = R2,
    ``"rollout"`` = R3); the default methods below follow it, so such a policy keeps working unchanged.
    The first-party policies (``none``, ``replay-old``, ``replay-rollout``) ship in ``rlzoo-routing``.
    """

    kind = "router"
    metric_namespace = "router"
    source: ClassVar[RoutingSource] = "none"

    def replays_routing(self) -> bool:
        """Whether the policy ever replays experts (it then needs a mixture-of-experts model)."""
        return self.source != "none"

    def needs_rollout_routing(self) -> bool:
        """Whether the policy uses the rollout engine's experts (the run then requires an engine that records)."""
        return self.source == "rollout"

    def needs_old_pass(self) -> bool:
        """Whether :meth:`update_routing` reads ``recorded.old``, the training engine's old pass (R2); without one
        (``algorithm.old_logprobs: rollout-only``) the policy is asked with ``recorded.old`` ``None``."""
        return self.source == "old"

    def old_pass_routing(self, recorded: RecordedRouting) -> Routing | None:
        """Experts to replay in the old-log-prob pass (``recorded.old`` is ``None``); ``None`` routes afresh."""
        return recorded.rollout if self.source == "rollout" else None

    def update_routing(self, recorded: RecordedRouting) -> Routing | None:
        """Experts every update pass replays, for the whole batch; ``None`` routes afresh."""
        return {"none": None, "old": recorded.old, "rollout": recorded.rollout}[self.source]

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """A policy that replays needs a mixture-of-experts model; R3 a rollout engine that records routing; R2 the
        training engine's old pass (not ``algorithm.old_logprobs: rollout-only``)."""
        problems = []
        if self.replays_routing() and run.model.moe is False:
            hint = (
                "model.path: a mixture-of-experts model"
                if run.config.model.path
                else "model.tiny.architecture: qwen3_moe"
            )
            usable = _policies(run, lambda policy: not policy.replays_routing())
            problems.append(
                (
                    f"{at}.name",
                    f"{self.name!r} replays expert routing, but the model is dense (no mixture-of-experts router); on a "
                    f"dense model use null or {', '.join(map(repr, usable))}, or set {hint}",
                )
            )
        engine = run.rollout_engine
        if self.needs_rollout_routing() and engine is not None and not engine.can_record_routing:
            recording = run.names("rollout_engine", lambda cls: cls.can_record_routing)
            problems.append(
                (
                    "rollout.engine.name",
                    f"{engine.name!r} does not record MoE routing, which router policy {self.name!r} replays; use one of "
                    f"{', '.join(map(repr, recording))}",
                )
            )
        if self.needs_old_pass() and run.config.algorithm.old_logprobs == "rollout-only":
            usable = _policies(run, lambda policy: not policy.needs_old_pass())
            problems.append(
                (
                    f"{at}.name",
                    f"{self.name!r} replays the experts of the training engine's old pass, which algorithm.old_logprobs: "
                    f"rollout-only does not run; use {', '.join(map(repr, usable))}, or old_logprobs: rollout",
                )
            )
        return problems


def _policies(run: RunFacts, fits: Callable[[RouterPolicy], bool]) -> list[str]:
    """Router policies to suggest: those that, with their default parameters, ``fits`` accepts. A policy that
    cannot be built without parameters of its own is not suggested."""
    names = []
    for info in run.registry.components("router"):
        try:
            policy = info.cls()
        except (TypeError, ValueError):  # pydantic's ValidationError is a ValueError
            continue
        if fits(policy):
            names.append(info.name)
    return names
