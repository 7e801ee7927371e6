"""The rule for numbers in every config section and component's parameters (:class:`rlzoo.config.base.Section`,
:class:`rlzoo.interfaces.Params`, third parties' included): a boolean is not a number, an integer is an integer, and
a float fits in float32.

pydantic's lax mode reads ``true`` as 1 for an ``int`` or ``float`` field, and ``3.0`` or ``"3"`` as 3 for an
``int`` one, so ``rollout.max_staleness: true`` ran as 1 without a word; and a float of 1e308 passes, to overflow the
float32 tensors it is multiplied into (every advantage NaN). :func:`strict_numbers` rewrites a model's core schema so
that, at any depth (``list[int]``, ``dict[str, float]``, ``int | None``):

- an ``int`` is pydantic's strict integer (an int, nothing else), a boolean refused with its own message;
- a ``float`` refuses a boolean, still reads an int and a numeric string (PyYAML reads ``1e-4`` as text), and
  refuses a value beyond float32 (``|x| > 3.4e38``): every float of a config ends in a tensor, a float32 kernel or a
  timer, none of which takes it.

YAML integers and ``--set key=3`` (parsed as YAML) are ints, so they pass.
"""

from __future__ import annotations

from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

FLOAT32_MAX = 3.4028234663852886e38
_DONE = "rlzoo_numbers"  # a schema node already rewritten (nested models are walked by their parents too)
_SKIP = ("metadata", "serialization", "ref")


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError(
            "bool_is_not_a_number", f"{str(value).lower()} is a boolean, not a number: write the number you mean"
        )
    return value


def fits_float32(value: float) -> float:
    """``value``, if float32 holds it (else a validation error saying so)."""
    if abs(value) > FLOAT32_MAX:
        raise PydanticCustomError(
            "float32_overflow",
            f"{value:g} does not fit in float32, the number type of the tensors and kernels it feeds: at most "
            f"{FLOAT32_MAX:.4g} in size",
        )
    return value


def _rewrite(node: Any) -> Any:
    if isinstance(node, list):
        return [_rewrite(child) for child in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind in ("int", "float"):
        metadata = node.setdefault("metadata", {})
        if metadata.get(_DONE):
            return node
        metadata[_DONE] = True
        if kind == "int":
            node["strict"] = True
            return core_schema.no_info_before_validator_function(_not_bool, node)
        return core_schema.no_info_before_validator_function(
            _not_bool, core_schema.no_info_after_validator_function(fits_float32, node)
        )
    for key, child in list(node.items()):
        if key not in _SKIP:
            node[key] = _rewrite(child)
    return node


def strict_numbers(schema: CoreSchema) -> CoreSchema:
    """``schema`` with every ``int`` and ``float`` in it held to the rule above (in place; idempotent)."""
    return _rewrite(schema)


class StrictNumbers:
    """Mixed into a pydantic model base: its subclasses' schemas follow :func:`strict_numbers`."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return strict_numbers(handler(source))
