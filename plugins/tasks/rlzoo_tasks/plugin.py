"""Entry point of the ``rlzoo-tasks`` distribution: contributes the task components."""

from __future__ import annotations

import rlzoo


@rlzoo.hookimpl
def rlzoo_tasks() -> list[type]:
    from rlzoo_tasks.arithmetic import ArithmeticTask
    from rlzoo_tasks.calculator_arithmetic import CalculatorArithmeticTask
    from rlzoo_tasks.chain import ChainTask
    from rlzoo_tasks.dataset import DatasetTask
    from rlzoo_tasks.jsonl import JsonlTask

    return [ArithmeticTask, CalculatorArithmeticTask, ChainTask, DatasetTask, JsonlTask]
