"""Entry point of the ``rlzoo-tools`` distribution: contributes the tools, the tool-call parser and the tool-calling environment."""

from __future__ import annotations

import rlzoo


@rlzoo.hookimpl
def rlzoo_tools() -> list[type]:
    from rlzoo_tools.calculator import Calculator
    from rlzoo_tools.python_tool import PythonTool

    return [Calculator, PythonTool]


@rlzoo.hookimpl
def rlzoo_tool_parsers() -> list[type]:
    from rlzoo_tools.hermes import HermesParser

    return [HermesParser]


@rlzoo.hookimpl
def rlzoo_environments() -> list[type]:
    from rlzoo_tools.environment import ToolCalling

    return [ToolCalling]
