"""What every part of the run config is built from: the ``Section`` base, the component specs (one class per hook
kind), the learning-rate, Adam-beta and partial-rollout types, and the components a config that names none gets.

A component is written ``{name: <registered name>, <its parameters>...}``: a :class:`ComponentSpec` of its kind.
The kinds are the plugin hooks' (:data:`rlzoo.hookspecs.HOOK_KINDS`); :data:`SPECS` has one spec class for each.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from rlzoo.hookspecs import HOOK_KINDS
from rlzoo.util.strict_numbers import StrictNumbers

LearningRate = Annotated[float, Field(gt=0)]
"""An optimizer's learning rate: positive (a float32 number, as every float of a section: :class:`Section`)."""
Beta = Annotated[float, Field(ge=0, lt=1)]
"""One of Adam's moment decays, in [0, 1)."""
PartialMode = Annotated[
    Literal["off", "continue", "restart"], BeforeValidator(lambda value: "off" if value is False else value)
]
"""``rollout.partial``; YAML 1.1 reads a bare ``off`` as false, which means "off" here."""


class Section(StrictNumbers, BaseModel):
    """A section of the run config. Every number must be finite (``inf``, ``-inf`` and ``nan`` are refused, also
    as text through ``--set``): no setting means "unbounded" by an infinity (those use ``null``), and a non-finite
    learning rate, coefficient or clip range would only turn the weights into NaN. An integer is an integer (not a
    boolean) and a float fits in float32 (:mod:`rlzoo.util.strict_numbers`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ComponentSpec(BaseModel):
    """``name`` selects a registered component of this spec's kind; every other key is one of its parameters
    (validated by the component's ``Params``, which refuse non-finite numbers as the sections do)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    kind: ClassVar[str] = ""
    name: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _spec_class(kind: str) -> type[ComponentSpec]:
    return type(f"{kind.title().replace('_', '')}Spec", (ComponentSpec,), {"kind": kind})


#: the spec class of each component kind, one per plugin hook
SPECS: dict[str, type[ComponentSpec]] = {kind: _spec_class(kind) for kind in HOOK_KINDS.values()}


def spec_class(kind: str) -> type[ComponentSpec]:
    """The spec class of component ``kind``: a field typed ``spec_class("clipper")`` holds ``{name: <a clipper>,
    <its parameters>...}``. Sections type their fields with this call rather than ``SPECS["clipper"]``: linters read
    a string inside an annotation as the name of a type."""
    return SPECS[kind]


# the engines a config that names none runs on: in-process, installed with rlzoo itself (the cold start evaluates
# with the rollout one)
DEFAULT_ROLLOUT_ENGINE = "hf"
DEFAULT_TRAINING_ENGINE = "torch"
# episodes: one turn unless an environment says otherwise; tool calls in the Hermes / Qwen format
DEFAULT_ENVIRONMENT = "single-turn"
DEFAULT_TOOL_PARSER = "hermes"
# the critic's loss as verl's compute_value_loss, and its default loss_agg_mode
DEFAULT_VALUE_LOSS = "clipped"
DEFAULT_CRITIC_AGGREGATION = "token-mean"
