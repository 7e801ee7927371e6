"""The base every pluggable component shares: a kind, a name, and a pydantic parameter model.

A component is a small class. The registry finds it through a plugin hook, the config selects it with
``name:`` and validates the remaining keys against its ``Params`` model (unknown keys are errors).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Params(BaseModel):
    """Parameters of a component. Extra keys are rejected so a typo is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Component:
    """A named, configurable building block.

    Subclasses set ``name`` (unique within their ``kind``) and, if they take parameters, a nested ``Params``
    model. The first line of the class docstring is the summary shown by ``rlzoo plugins list``; the rest
    states the formula.

    The catalogue attributes feed the generated component table (docs/components.md); all are optional:
    ``formula`` (one line, plain text), ``reference`` (the paper or source), ``verl_name`` and ``trl_name``
    (what verl / TRL call the same thing, empty where they have none).
    """

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params
    formula: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    verl_name: ClassVar[str] = ""
    trl_name: ClassVar[str] = ""
    #: Python packages the component imports when it starts (a run checks they are installed before starting)
    requires: ClassVar[tuple[str, ...]] = ()
    #: how to install ``requires``, shown when one is missing
    install_hint: ClassVar[str] = ""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0].strip() if doc else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"
