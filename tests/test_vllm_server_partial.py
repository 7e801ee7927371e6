"""The vllm-server engine's partial-rollout bookkeeping (:mod:`rlzoo.engines.vllm_server.partial`), its pure parts
without a server: a response's seeds, the request that samples it on, what an answer (finished or aborted by
``/pause?mode=abort``) adds to it, ``continue`` and ``restart`` after an update, and the version of a request from
what its server reported. Against real servers: integration_tests/test_vllm_server.py
(``test_partial_rollouts_*``)."""

from __future__ import annotations

import pytest

from rlzoo.engines.vllm_server.client import Completion
from rlzoo.engines.vllm_server.partial import (
    Response,
    after_update,
    generation,
    request_of,
    responses_for,
    take,
    version_of,
)
from rlzoo.errors import RlzooError

EOS = 0
BUDGET = 6


def test_response_j_of_a_prompt_is_seeded_as_vllm_seeds_the_jth_sample_of_an_n_sample_request():
    groups = responses_for([[5, 6], [7]], 3, [100, None])
    assert [[r.seed for r in group] for group in groups] == [[100, 101, 102], [None, None, None]]
    assert [r.prompt for r in groups[0]] == [[5, 6]] * 3


def test_an_aborted_answer_keeps_its_tokens_and_the_response_goes_on_from_them():
    response = Response([5, 6], seed=7)
    take(response, Completion([9, 8], [-0.5, -1.5], "abort"), version=3, eos=EOS, budget=BUDGET)
    assert (response.tokens, response.logprobs, response.versions) == ([9, 8], [-0.5, -1.5], [3, 3])
    assert not response.done and not response.finished
    assert request_of(response, BUDGET) == ([5, 6, 9, 8], BUDGET - 2, 7)  # prompt + tokens so far, the rest


def test_an_answer_that_ends_at_eos_finishes_the_response_and_one_at_the_budget_ends_it_unfinished():
    response = Response([5], seed=None, tokens=[9], logprobs=[-1.0], versions=[0])
    take(response, Completion([4, EOS], [-0.1, -0.2], "stop"), version=1, eos=EOS, budget=BUDGET)
    assert response.done and response.finished and response.versions == [0, 1, 1]
    cut = Response([5], seed=None)
    take(cut, Completion([1] * BUDGET, [-1.0] * BUDGET, "length"), version=0, eos=EOS, budget=BUDGET)
    assert cut.done and not cut.finished


def test_an_abort_that_lands_after_the_last_token_of_the_budget_ends_the_response():
    response = Response([5], seed=None, tokens=[1] * 4, logprobs=[-1.0] * 4, versions=[0] * 4)
    take(response, Completion([2, 3], [-1.0, -1.0], "abort"), version=0, eos=EOS, budget=BUDGET)
    assert response.done and not response.finished


def test_an_aborted_answer_with_no_token_changes_nothing():
    response = Response([5], seed=1, tokens=[9], logprobs=[-1.0], versions=[0])
    take(response, Completion([], [], "abort"), version=1, eos=EOS, budget=BUDGET)
    assert (response.tokens, response.versions, response.done) == ([9], [0], False)


def test_continue_keeps_the_tokens_and_restart_drops_them_both_with_a_fresh_seed():
    def interrupted():
        return Response([5], seed=11, tokens=[9, 8], logprobs=[-1.0, -2.0], versions=[0, 0])

    kept, dropped = interrupted(), interrupted()
    after_update(kept, "continue", new_version=1)
    after_update(dropped, "restart", new_version=1)
    assert (kept.tokens, kept.versions) == ([9, 8], [0, 0])
    assert (dropped.tokens, dropped.logprobs, dropped.versions) == ([], [], [])
    assert request_of(dropped, BUDGET)[:2] == ([5], BUDGET)  # the prompt alone, the whole budget
    assert kept.seed == dropped.seed != 11  # the continuation must not replay the first request's draws
    unseeded = Response([5], seed=None)
    after_update(unseeded, "continue", new_version=1)
    assert unseeded.seed is None


def test_a_continued_response_records_each_tokens_version():
    response = Response([5], seed=None)
    take(response, Completion([9, 8], [-1.0, -2.0], "abort"), version=0, eos=EOS, budget=BUDGET)
    after_update(response, "continue", new_version=1)
    take(response, Completion([7, EOS], [-0.3, -0.4], "stop"), version=1, eos=EOS, budget=BUDGET)
    g = generation(response)
    assert (g.prompt_ids, g.response_ids, g.response_logprobs) == ([5], [9, 8, 7, EOS], [-1.0, -2.0, -0.3, -0.4])
    assert g.versions == [0, 0, 1, 1] and g.finished


def test_a_token_count_that_disagrees_with_the_log_probs_is_refused():
    with pytest.raises(RlzooError, match="2 tokens but 1 log-probs"):
        take(Response([5], None), Completion([9, 8], [-1.0], "stop"), version=0, eos=EOS, budget=BUDGET)


def test_the_version_a_server_reported_maps_to_the_trainers_and_one_never_pushed_is_refused():
    assert version_of("4", {"4": 12}, "http://s:1") == 12
    with pytest.raises(RlzooError, match=r"http://s:1 reports weight version '3'.*refused"):
        version_of("3", {"4": 12}, "http://s:1")
