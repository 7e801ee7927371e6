"""First-party rlzoo tasks: ``arithmetic``, ``chain`` (multi-step, for process rewards) and ``jsonl`` (user data).

Each registers where it is defined (``@rlzoo.register``), found through the ``rlzoo`` entry-point group (see
:mod:`rlzoo_tasks.plugin`); this package imports only rlzoo's public API.
"""

from rlzoo_tasks.arithmetic import ArithmeticTask
from rlzoo_tasks.chain import ChainTask
from rlzoo_tasks.jsonl import JsonlTask

__all__ = ["ArithmeticTask", "ChainTask", "JsonlTask"]
