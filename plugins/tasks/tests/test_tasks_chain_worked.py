"""The ``chain`` task's worked format (``worked: true``): each operation written out, scored by ``process``."""

from __future__ import annotations

import re

import pytest

from rlzoo.registry import default_registry
from rlzoo_tasks.chain import ChainTask

STEP = re.compile(r"(\d+)([-+])(\d+)=(\d+)")


def chain(**params) -> ChainTask:
    return ChainTask(ChainTask.Params(**params))


def process_verifier():
    return default_registry().create("verifier", "process")


def test_worked_demonstration_writes_every_operation_from_the_prompt():
    task = chain(terms=5, max_operand=30, worked=True, train_size=50, eval_size=10)
    for s in task.samples("train", 50, 0):
        *ops, final = s.demonstration.split(";")
        assert final == s.answer == s.meta["steps"][-1]
        assert s.meta["steps"] == [*ops, final]
        operands = re.findall(r"[-+]?\d+", s.prompt[:-1])
        total = int(operands[0])
        assert len(ops) == len(operands) - 1
        for op, operand in zip(ops, operands[1:], strict=True):
            a, sign, b, c = STEP.fullmatch(op).groups()
            assert int(a) == total and sign + b == (operand if operand[0] in "+-" else "+" + operand)
            total = total + int(b) if sign == "+" else total - int(b)
            assert int(c) == total >= 0
        assert int(s.answer) == total


def test_worked_off_is_unchanged():
    plain = chain(terms=4, max_operand=20).samples("train", 30, 1)
    worked = chain(terms=4, max_operand=20, worked=True).samples("train", 30, 1)
    assert [s.prompt for s in plain] == [s.prompt for s in worked]  # same problems
    assert [s.answer for s in plain] == [s.answer for s in worked]
    assert all(";" not in s.meta["steps"][0] and "=" not in s.demonstration for s in plain)


def test_process_verifier_scores_the_worked_format():
    verifier = process_verifier()
    s = chain(terms=6, max_operand=50, worked=True).samples("train", 1, 3)[0]
    right = verifier.verify(s, s.demonstration)
    assert right.reward == 1.0 and right.step_rewards == [1.0] * len(s.meta["steps"])
    steps = s.demonstration.split(";")
    a, sign, b, c = STEP.fullmatch(steps[1]).groups()
    steps[1] = f"{a}{sign}{b}={int(c) + 1}"  # one wrong intermediate result
    one_wrong = verifier.verify(s, ";".join(steps))
    assert one_wrong.step_rewards[1] == 0.0 and sum(one_wrong.step_rewards) == len(steps) - 1
    assert one_wrong.reward == 1.0  # the outcome is the final total, as for the plain chain
    assert verifier.verify(s, ";".join(s.demonstration.split(";")[:-1])).reward == 0.0  # no final answer
    assert verifier.verify(s, s.answer).reward == 0.0  # the answer alone skips the work


@pytest.mark.parametrize("seed", [0, 1])
def test_long_bench_scale_responses_are_128_to_256_tokens(seed):
    """examples/bench/long.yaml's task: responses (one token per character, plus <eos>) of 128-256 tokens."""
    task = chain(terms=18, max_operand=99, worked=True)
    lengths = [len(s.demonstration) + 1 for s in task.samples("train", 500, seed)]
    assert 128 <= sum(lengths) / len(lengths) <= 256
    assert max(lengths) <= 256
