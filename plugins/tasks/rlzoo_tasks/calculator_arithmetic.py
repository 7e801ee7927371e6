"""The ``calculator-arithmetic`` task: multi-digit arithmetic that a tiny model cannot do alone but can with the
``calculator`` tool (a multi-turn episode: call, read the result, answer)."""

from __future__ import annotations

import random
import string
from typing import ClassVar

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Sample
from rlzoo_tasks.arithmetic import ArithmeticTask, Operation

#: every printable character but the control whitespace: tool calls, tool results and error messages encode
_ALPHABET = "".join(sorted(set(string.printable) - set("\t\r\x0b\x0c")))


@rlzoo.register("task", "calculator-arithmetic")
class CalculatorArithmeticTask(ArithmeticTask):
    """Multi-digit arithmetic solved with the calculator tool: ``482*371=`` answered ``178822`` after a call.

    Operands have ``digits`` digits (default: 3-digit products). The episode a demonstration shows: the model calls ``calculator`` with the problem's expression, reads the
    result, and answers it (``demonstration_turns``). A share ``1 - tool_demonstrations`` of the cold start's
    demonstrations answer directly instead, without a call, so the cold-start model calls the tool only sometimes
    and RL has something to learn: calling is what makes the answer right. Scored by ``math`` on the last turn;
    the prompt is the plain problem (the character tokenizer has no chat template, so tools are not described to
    the model: the demonstrations teach the call). Run with ``episode: {environment: {name: tools}, tools:
    [{name: calculator}], max_turns: 2}`` (``examples/tools_calculator.yaml``).
    """

    default_verifier: ClassVar[str] = "math"

    class Params(ArithmeticTask.Params):  # arithmetic's parameters, with 3-digit products by default
        digits: int = Field(3, ge=1, le=6, description="digits of each operand")
        operations: list[Operation] = Field(
            default_factory=lambda: ["*"], min_length=1, description="operations to draw from"
        )
        tool_demonstrations: float = Field(
            0.5,
            ge=0.0,
            le=1.0,
            description="share of the demonstrations that call the calculator (the rest answer directly)",
        )

    def draw(self, rng: random.Random) -> Sample:
        sample = super().draw(rng)
        expression = sample.prompt.rstrip("=")
        call = {"name": "calculator", "arguments": {"expression": expression}}
        if rng.random() < self.params.tool_demonstrations:
            sample.demonstration_turns = [{"content": "", "tool_calls": [call]}, {"content": sample.answer}]
        else:
            sample.demonstration_turns = [{"content": sample.answer}]
        return sample

    def alphabet(self) -> str:
        return _ALPHABET
