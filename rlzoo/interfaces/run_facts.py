"""What a component's start-up check knows about the run: the config, the model's facts, the processes, the other
components (constructed, never started) and the memory estimate.

:meth:`rlzoo.interfaces.Component.preflight` receives a :class:`RunFacts`; ``rlzoo config check`` and the start of
``rlzoo train`` (:func:`rlzoo.preflight.checks.preflight`) build it once and ask every component the config names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlzoo.models.folder import ModelFacts, ModelFolder

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig
    from rlzoo.models.memory import MemoryEstimate

#: ``(dotted config field, message saying what is allowed)``
Problem = tuple[str, str]


class RegisteredComponent(Protocol):
    """One registration in a :class:`ComponentCatalogue`: the component's name, class (a
    :class:`rlzoo.interfaces.Component` subclass) and distribution (``script my_loss.py`` for a script's)."""

    @property
    def name(self) -> str: ...

    @property
    def distribution(self) -> str: ...

    @property
    def cls(self) -> type[Any]: ...  # the kind's base class is unknown here: attributes by kind (trains_values, ...)


class ComponentCatalogue(Protocol):
    """The registered components, read-only: what a preflight rule looks up to suggest or check a component
    (:class:`rlzoo.registry.Registry` is one)."""

    def names(self, kind: str) -> list[str]:
        """The registered names of ``kind``, sorted."""

    def components(self, kind: str | None = None) -> Sequence[RegisteredComponent]:
        """Every registration of ``kind`` (of every kind with ``None``)."""

    def get(self, kind: str, name: str) -> RegisteredComponent:
        """The registration of ``kind`` ``name``; raises if there is none (or more than one)."""


@dataclass
class RunFacts:
    """Everything a component may consult to report the problems a run would hit, before anything starts.

    ``components`` maps each config field that names a component (``rollout.engine``, ``algorithm.router``,
    ``algorithm.reward_shaping.0``, ...) to the constructed component; a component that failed to construct is
    absent (its failure is reported already). ``registry``: the registered components (the run's
    :class:`rlzoo.registry.Registry`). ``memory`` is the GPU memory estimate per rank and ``device_memory`` the
    memory of one GPU to fit it in (``None`` when unknown / not checked).
    """

    config: RunConfig
    model: ModelFacts
    world: int
    registry: ComponentCatalogue
    # values: rlzoo.interfaces.Component instances (not imported here: Component.preflight takes a RunFacts)
    components: dict[str, Any] = field(default_factory=dict)
    memory: MemoryEstimate | None = None
    device_memory: int | None = None
    device_memory_field: str | None = None  # where device_memory was set: trainer.device_memory or --device-memory
    resume: Path | None = None  # the --resume run folder; None: a new run
    allow_changes: tuple[str, ...] = ()  # fields a resume may change besides the resumable ones (--allow-changes)

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

    @staticmethod
    def model_folder(path: Path | str) -> ModelFolder:
        """A Hugging Face model folder read from its files' metadata, nothing loaded
        (:class:`rlzoo.models.folder.ModelFolder`): for a component whose parameters name a model of its own (a
        reward model), checked as the policy's, critic's and teacher's folders are."""
        return ModelFolder.read(path)
