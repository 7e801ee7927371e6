"""The fault table of the 2026 zoo (issue 37), through the real CLI: a policy loss's or an advantage's parameter out
of range, gdpo's parts against the verifier's, a source rlzoo's engines cannot feed, pass@k with one response per
prompt, two weighted-verifier parts with one label -- each ``rlzoo config check`` exits 1 with one ``error:`` line
naming the field, no traceback. gdpo with a verifier that returns no parts and does not declare it stops at the first
step (tests/test_zoo_2026_runs.py). The cases reuse tests/test_fault_table.py's helpers and run in-process through
the CLI's entry function, one after the other (tests/cli_testlib.py)."""

from __future__ import annotations

import pytest
from test_fault_table import Case, Context, Outcome, _environment, run_cases, sets

WEIGHTED = (
    "verifier={name: weighted, verifiers: [{name: exact, label: correct}, {name: regex, pattern: x, label: format}]}"
)
CASES = [
    Case(
        "dppo-tv-bound-above-one",
        sets("algorithm.clipper={name: dppo-tv, eps_low: 1.5}"),
        ("algorithm.clipper.eps_low: Input should be less than or equal to 1",),
    ),
    Case(
        "dppo-kl-truncation-below-one",
        sets("algorithm.clipper={name: dppo-kl, c: 0.5}"),
        ("algorithm.clipper.c: Input should be greater than or equal to 1",),
    ),
    Case(
        "dro-beta-zero",
        sets("algorithm.clipper={name: dro, beta: 0}"),
        ("algorithm.clipper.beta: Input should be greater than 0",),
    ),
    Case(
        "vespo-negative-decay",
        sets("algorithm.clipper={name: vespo, lambda_pos: -1}"),
        ("algorithm.clipper.lambda_pos: Input should be greater than 0",),
    ),
    Case(
        "gdpo-negative-eps",
        sets("algorithm.advantage={name: gdpo, eps: -1}"),
        ("algorithm.advantage.eps: Input should be greater than or equal to 0",),
    ),
    Case(
        "gdpo-weight-of-an-unused-part",
        sets("algorithm.advantage={name: gdpo, parts: [correct], weights: {format: 2}}"),
        ("algorithm.advantage.weights: names 'format', which is not in parts (correct)",),
    ),
    Case(
        "gdpo-part-the-verifier-lacks",
        sets(WEIGHTED, "algorithm.advantage={name: gdpo, parts: [correct, style]}"),
        (
            "algorithm.advantage.parts.1: 'style' is not a reward part of verifier 'weighted'; its parts: correct, format",
        ),
    ),
    Case(
        "otb-with-routing-replay",
        sets("algorithm.advantage.name=tir-optimal-token-baseline", "algorithm.router={name: replay-old}"),
        (
            "algorithm.router: 'replay-old' replays expert routing, but the pass that computes the token statistics "
            "(sum_pi_squared) for advantage 'tir-optimal-token-baseline'",
        ),
    ),
    Case(
        "passk-one-response",
        sets("algorithm.advantage.name=grpo-passk", "rollout.group_size=1"),
        ("rollout.group_size: 1, but advantage 'grpo-passk'",),
    ),
    Case(
        "weighted-one-label-twice",
        sets("verifier={name: weighted, verifiers: [{name: exact, label: x}, {name: math, label: x}]}"),
        ("verifier.verifiers.1.label: two parts are labelled 'x'",),
    ),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Outcome]:
    ctx = Context(tmp_path_factory.mktemp("unused-template"))
    procs = run_cases([(case, tmp_path_factory.mktemp(case.id)) for case in CASES], ctx, _environment())
    return {case.id: proc for case, proc in zip(CASES, procs, strict=True)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_through_the_real_cli(results, case: Case):
    proc = results[case.id]
    shown = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    output = proc.stdout + proc.stderr
    assert proc.returncode == case.code, shown
    assert "Traceback" not in output, shown
    for text in case.expect:
        assert text in output, f"{text!r} missing; {shown}"
    assert len([line for line in output.splitlines() if line.startswith("error:")]) == 1, shown
    field = case.expect[0].split(":")[0]
    assert output.count(f"  {field}:") == 1, shown  # the field named once
