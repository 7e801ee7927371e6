"""What a component's start-up check knows about the run: the config, the model's facts, the processes, the other
components (constructed, never started) and the memory estimate.

:meth:`rlzoo.interfaces.Component.preflight` receives a :class:`RunFacts`; ``rlzoo config check`` and the start of
``rlzoo train`` (:func:`rlzoo.preflight.checks.preflight`) build it once and ask every component the config names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig
    from rlzoo.interfaces.base import Component
    from rlzoo.models.memory import MemoryEstimate, ModelShape
    from rlzoo.registry import Registry

#: ``(dotted config field, message saying what is allowed)``
Problem = tuple[str, str]


@dataclass
class ModelFacts:
    """What the preflight knows about the policy without building it; ``None`` where it cannot tell.

    ``tiny``: the model is built from ``model.tiny`` (so a shape problem is reported at ``model.tiny.<field>``,
    otherwise at ``model.path``)."""

    moe: bool | None
    head_dim: int | None
    max_positions: int | None
    chat_template: bool | None = None  # whether its tokenizer has a chat template
    shape: ModelShape | None = None  # its sizes, for the memory estimate
    tiny: bool = False
    chat_template_tools: bool | None = None  # whether its chat template reads `tools` (renders tool descriptions)

    def field(self, name: str) -> str:
        """Where a problem with the model's ``name`` (e.g. ``head_dim``) is reported."""
        return f"model.tiny.{name}" if self.tiny else "model.path"


@dataclass
class RunFacts:
    """Everything a component may consult to report the problems a run would hit, before anything starts.

    ``components`` maps each config field that names a component (``rollout.engine``, ``algorithm.router``,
    ``algorithm.reward_shaping.0``, ...) to the constructed component; a component that failed to construct is
    absent (its failure is reported already). ``memory`` is the GPU memory estimate per rank and
    ``device_memory`` the memory of one GPU to fit it in (``None`` when unknown / not checked).
    """

    config: RunConfig
    model: ModelFacts
    world: int
    registry: Registry
    components: dict[str, Component] = field(default_factory=dict)
    memory: MemoryEstimate | None = None
    device_memory: int | None = None

    @property
    def rollout_engine(self) -> Any:
        """The constructed rollout engine (``None`` if it failed to construct)."""
        return self.components.get("rollout.engine")

    @property
    def training_engine(self) -> Any:
        """The constructed training engine (``None`` if it failed to construct)."""
        return self.components.get("trainer.engine")

    def names(self, kind: str, fits: Any = None) -> list[str]:
        """Registered ``kind`` names whose class ``fits(cls)`` (all with ``fits`` ``None``): to suggest in a message."""
        return [info.name for info in self.registry.components(kind) if fits is None or fits(info.cls)]
