"""The ``arithmetic`` task: one binary operation on d-digit numbers, answered with the result only."""

from __future__ import annotations

import random
import re
from typing import ClassVar, Literal

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Params, Sample
from rlzoo_tasks._generated import GeneratedTask

Operation = Literal["+", "-", "*"]
_PROBLEM = re.compile(r"(\d+)([-+*])(\d+)=")


@rlzoo.register("task", "arithmetic")
class ArithmeticTask(GeneratedTask):
    """Binary arithmetic on d-digit numbers: prompt ``"12+34="``, response and answer ``"46"``.

    Operands have exactly ``digits`` digits (0-9 when ``digits`` is 1); each problem picks one of
    ``operations`` uniformly (list an operation twice to weight it). For ``-`` the operands are ordered so the
    result is never negative. The demonstration is the answer itself (the end-of-sequence token is the
    tokenizer's business, not part of the text). The eval pool is fixed and seed-independent, and ``12+34`` and
    ``34+12`` count as one problem when train and eval are split (see ``rlzoo_tasks._generated``). Scored by
    the ``math`` verifier by default.
    """

    default_verifier: ClassVar[str] = "math"

    class Params(Params):
        digits: int = Field(2, ge=1, le=6, description="digits of each operand")
        operations: list[Operation] = Field(
            default_factory=lambda: ["+"], min_length=1, description="operations to draw from"
        )
        train_size: int = Field(5000, ge=1, description="train samples returned when count is None")
        eval_size: int = Field(200, ge=1, description="size of the fixed eval pool (at most 1/5 of all problems)")

    def _operand_range(self) -> tuple[int, int]:
        d = self.params.digits
        return (0 if d == 1 else 10 ** (d - 1)), 10**d - 1

    def universe_size(self) -> int:
        lo, hi = self._operand_range()
        n = hi - lo + 1
        # split keys are unordered operand pairs for every operation (commutative ones, and "-" is ordered)
        return len(set(self.params.operations)) * n * (n + 1) // 2

    def split_key(self, sample: Sample) -> str:
        match = _PROBLEM.fullmatch(sample.prompt)
        assert match is not None, sample.prompt
        a, op, b = match.groups()
        if op in "+*" and int(a) > int(b):
            a, b = b, a
        return f"{a}{op}{b}"

    def draw(self, rng: random.Random) -> Sample:
        lo, hi = self._operand_range()
        op = rng.choice(self.params.operations)
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if op == "-" and a < b:
            a, b = b, a
        value = a + b if op == "+" else a - b if op == "-" else a * b
        answer = str(value)
        return Sample(prompt=f"{a}{op}{b}=", answer=answer, demonstration=answer)

    def alphabet(self) -> str:
        # independent of the chosen operations, so one tokenizer serves every configuration of this task
        return "".join(sorted(set("0123456789+-*=")))
