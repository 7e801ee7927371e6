"""The synthetic tasks: determinism, disjoint splits, alphabet coverage, correct answers and demonstrations."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from rlzoo.interfaces import Sample, Task
from rlzoo_tasks.arithmetic import ArithmeticTask
from rlzoo_tasks.chain import ChainTask


def arithmetic(**params) -> ArithmeticTask:
    return ArithmeticTask(ArithmeticTask.Params(**params))


def chain(**params) -> ChainTask:
    return ChainTask(ChainTask.Params(**params))


CONFIGS = [
    arithmetic(),
    arithmetic(digits=1, operations=["+", "-", "*"], train_size=300, eval_size=50),
    arithmetic(digits=3, operations=["-", "*"], train_size=500, eval_size=100),
    chain(),
    chain(terms=2, max_operand=3, train_size=200, eval_size=50),
    chain(terms=8, max_operand=20, train_size=300, eval_size=100),
]
IDS = ["arith-default", "arith-1digit-all-ops", "arith-3digit", "chain-default", "chain-tiny", "chain-long"]


@pytest.fixture(params=range(len(CONFIGS)), ids=IDS)
def task(request) -> Task:
    return CONFIGS[request.param]


def test_deterministic_given_seed(task: Task):
    for split in ("train", "eval"):
        a = task.samples(split, 40, seed=7)
        b = type(task)(task.params).samples(split, 40, seed=7)  # a fresh instance, nothing cached
        assert a == b
        assert all(isinstance(s, Sample) for s in a)
    prompts = [[s.prompt for s in task.samples("train", 40, seed=seed)] for seed in (7, 8)]
    assert prompts[0] != prompts[1]


def test_count_none_uses_split_sizes(task: Task):
    assert len(task.samples("train", None, 0)) == task.params.train_size
    assert len(task.samples("eval", None, 0)) == task.params.eval_size
    assert task.samples("train", 0, 0) == []


def test_train_and_eval_are_disjoint_across_seeds(task: Task):
    eval_keys = {task.split_key(s) for seed in (0, 1, 2) for s in task.samples("eval", None, seed)}
    eval_prompts = {s.prompt for seed in (0, 1, 2) for s in task.samples("eval", None, seed)}
    for seed in (0, 1, 2, 3):
        train = task.samples("train", None, seed)
        assert not eval_prompts & {s.prompt for s in train}
        assert not eval_keys & {task.split_key(s) for s in train}


def test_eval_pool_is_distinct_and_seed_independent(task: Task):
    pool = task.samples("eval", None, 0)
    assert len({s.prompt for s in task.eval_pool}) == len(task.eval_pool)
    assert {s.prompt for s in pool} == {s.prompt for s in task.samples("eval", None, 123)}
    assert 1 <= len(task.eval_pool) <= max(1, task.universe_size() // 5)


def test_alphabet_covers_prompts_answers_demonstrations(task: Task):
    alphabet = task.alphabet()
    assert len(set(alphabet)) == len(alphabet)
    for split in ("train", "eval"):
        for s in task.samples(split, 200, 3):
            assert set(s.prompt + s.answer + (s.demonstration or "")) <= set(alphabet), s


def test_unknown_split_and_bad_count_are_errors():
    with pytest.raises(ValueError, match="unknown split"):
        arithmetic().samples("test", 3, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        arithmetic().samples("train", -1, 0)


def test_returned_samples_do_not_alias_the_cached_pool():
    task = chain()
    first = task.samples("eval", 5, 0)
    first[0].meta["steps"].append("999")
    assert task.samples("eval", 5, 0)[0].meta["steps"][-1] != "999"


# -- arithmetic -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("digits", [1, 2, 4, 6])
@pytest.mark.parametrize("ops", [["+"], ["-"], ["*"], ["+", "-", "*"]])
def test_arithmetic_answers_are_correct(digits, ops):
    task = arithmetic(digits=digits, operations=ops, train_size=10, eval_size=10)
    for s in task.samples("train", 60, 1) + task.samples("eval", 10, 1):
        m = re.fullmatch(r"(\d+)([-+*])(\d+)=", s.prompt)
        assert m, s.prompt
        a, op, b = m.groups()
        assert op in ops
        assert len(a) == len(b) == digits or digits == 1
        assert a == str(int(a)) and b == str(int(b))  # no leading zeros
        assert int(s.answer) == eval(s.prompt[:-1])  # noqa: S307 - digits and operators only
        assert int(s.answer) >= 0
        assert s.demonstration == s.answer
        assert not s.demonstration.endswith("\n")


def test_arithmetic_commutative_variants_stay_in_one_split():
    task = arithmetic(digits=1, operations=["+", "*"], eval_size=50)
    eval_keys = {task.split_key(s) for s in task.eval_pool}
    assert task.split_key(Sample("3+4=", "7")) == task.split_key(Sample("4+3=", "7"))
    assert task.split_key(Sample("9-4=", "5")) != task.split_key(Sample("4-9=", "5"))
    for s in task.samples("train", 500, 0):
        a, op, b = re.fullmatch(r"(\d+)([+*])(\d+)=", s.prompt).groups()
        assert f"{min(a, b, key=int)}{op}{max(a, b, key=int)}" not in eval_keys


def test_arithmetic_train_samples_distinct_while_possible():
    prompts = [s.prompt for s in arithmetic().samples("train", 2000, 5)]
    assert len(set(prompts)) == len(prompts)
    tiny = arithmetic(digits=1, operations=["+"], eval_size=10)  # only 100 prompts exist
    assert len(tiny.samples("train", 500, 0)) == 500


@pytest.mark.parametrize(
    "params",
    [{"digits": 0}, {"digits": 7}, {"operations": []}, {"operations": ["/"]}, {"train_size": 0}, {"typo": 1}],
)
def test_arithmetic_rejects_bad_params(params):
    with pytest.raises(ValidationError):
        ArithmeticTask.Params(**params)


def test_default_verifiers():
    assert ArithmeticTask.default_verifier == "math"
    assert ChainTask.default_verifier == "process"


# -- chain ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("terms,max_operand", [(2, 9), (3, 9), (5, 50), (8, 9)])
def test_chain_steps_are_running_totals(terms, max_operand):
    task = chain(terms=terms, max_operand=max_operand, train_size=10, eval_size=10)
    for s in task.samples("train", 100, 2) + task.samples("eval", 10, 2):
        assert s.prompt.endswith("=")
        tokens = re.findall(r"[-+]?\d+", s.prompt[:-1])
        assert len(tokens) == terms
        assert all(0 <= abs(int(t)) <= max_operand for t in tokens)
        totals, total = [], int(tokens[0])
        for t in tokens[1:]:
            total += int(t)
            assert total >= 0
            totals.append(str(total))
        assert s.meta["steps"] == totals
        assert s.demonstration == ";".join(totals)
        assert s.answer == totals[-1] == str(eval(s.prompt[:-1]))  # noqa: S307


def test_chain_example_format():
    s = chain().samples("train", 1, 0)[0]
    assert re.fullmatch(r"\d+[-+]\d+[-+]\d+=", s.prompt)
    assert re.fullmatch(r"\d+;\d+", s.demonstration)


def test_chain_uses_both_operations():
    prompts = "".join(s.prompt for s in chain().samples("train", 200, 0))
    assert prompts.count("+") > 50 and prompts.count("-") > 50
