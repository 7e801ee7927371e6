"""First-party tools and tool-call parsers for multi-turn episodes (docs/tools.md).

- ``calculator`` (tool): exact arithmetic on a parsed expression (fractions, never ``eval``).
- ``python`` (tool): runs code in the ``code`` verifier's kernel sandbox and returns what it printed.
- ``hermes`` (tool_parser): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the Qwen/Hermes format.

Each registers where it is defined (``@rlzoo.register``), found through the ``rlzoo`` entry-point group
(:mod:`rlzoo_tools.plugin`); imports rlzoo's public API only
(and, for the sandbox, the ``rlzoo-verifiers`` distribution).
"""

from rlzoo_tools.calculator import Calculator
from rlzoo_tools.hermes import HermesParser
from rlzoo_tools.python_tool import PythonTool

__all__ = ["Calculator", "HermesParser", "PythonTool"]
