"""The ``chain`` task: a sum of several terms, answered step by step with the running totals."""

from __future__ import annotations

import random
from typing import ClassVar

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Params, Sample
from rlzoo_tasks._generated import GeneratedTask

STEP_SEPARATOR = ";"


@rlzoo.register("task", "chain")
class ChainTask(GeneratedTask):
    """Multi-step additions and subtractions, checked step by step: ``"5+3-2+4="`` -> ``"8;6;10"``.

    The prompt has ``terms`` operands in 0..``max_operand`` joined by ``+``/``-``. The demonstration lists the
    running total after each operation, separated by ``;``; the answer is the final total and
    ``meta["steps"]`` the expected running totals (``["8", "6", "10"]``). A subtraction never takes the
    running total below zero. Scored by the ``process`` verifier by default (one reward per step).

    ``worked: true`` writes every operation out in full and ends with the answer on its own:
    ``"5+3-2+4="`` -> ``"5+3=8;8-2=6;6+4=10;10"``, ``meta["steps"]`` = ``["5+3=8", "8-2=6", "6+4=10", "10"]``
    (so the ``process`` verifier rewards each written operation, and the outcome is the final total). About
    ``terms * (2 * digits + 4)`` characters: long responses for a character-level policy (the ``long`` scale of
    ``benchmarks/vs_trl.py``).
    """

    default_verifier: ClassVar[str] = "process"

    class Params(Params):
        terms: int = Field(3, ge=2, le=32, description="operands per problem")
        max_operand: int = Field(9, ge=1, le=9999, description="largest operand (operands start at 0)")
        train_size: int = Field(5000, ge=1, description="train samples returned when count is None")
        eval_size: int = Field(200, ge=1, description="size of the fixed eval pool (at most 1/5 of all problems)")
        worked: bool = Field(False, description="write each operation in full (a+b=c;...) and end with the answer")

    def universe_size(self) -> int:
        # lower bound: the all-"+" chains alone are (max_operand + 1) ** terms distinct problems
        return (self.params.max_operand + 1) ** self.params.terms

    def draw(self, rng: random.Random) -> Sample:
        m = self.params.max_operand
        total = rng.randint(0, m)
        parts = [str(total)]
        steps: list[str] = []
        for _ in range(self.params.terms - 1):
            before = total
            if rng.random() < 0.5:
                x = rng.randint(0, m)
                total += x
                parts.append(f"+{x}")
            else:
                x = rng.randint(0, min(m, total))
                total -= x
                parts.append(f"-{x}")
            steps.append(f"{before}{parts[-1]}={total}" if self.params.worked else str(total))
        if self.params.worked:
            steps.append(str(total))
        return Sample(
            prompt="".join(parts) + "=",
            answer=str(total),
            demonstration=STEP_SEPARATOR.join(steps),
            meta={"steps": steps},
        )

    def alphabet(self) -> str:
        return "".join(sorted(set("0123456789+-=" + STEP_SEPARATOR)))
