"""Partial rollouts on a pool of vLLM servers (``rollout.partial: continue|restart``): when the trainer publishes
newer weights while a generation is in flight, every server is paused with its requests aborted, the weights are
pushed, the servers resumed, and each unfinished response is sent again.

    one request per response (n = 1; response j of a prompt seeded seed + j, as vLLM seeds the j-th sample of an
    n-sample request, so up to the first update the tokens are plain generate()'s), each after the pool read the
    server's weight version (/weight_info) and refused one that disagrees with the trainer's
    while requests are in flight, every poll_s:
        if updates.pending():  stop: requests not sent yet are not sent; /pause?mode=abort on every server (vLLM
                               aborts its requests: a non-streamed one answers with finish_reason "abort" and the
                               tokens and log-probs sampled so far; clear_cache drops the old weights' KV blocks);
                               /abort_requests until every request has answered (one sent just after the pause is
                               queued by the paused server, not run: this aborts it too);
                               then updates.load() (the push: weights.py, or adapters.py under LoRA), /resume, and
            continue:  prompt + the tokens so far as the prompt, the rest of the token budget (prefilled again under
                       the new weights; AReaL's interruptible generation, PipelineRL's in-flight weight updates)
            restart:   the prompt, the whole budget; the tokens sampled so far are dropped

Why each token's version is the one the server reported for its request: no push starts while any request is in
flight (the push waits for the last answer), so every token of a request was sampled by the weights whose version
the server reported just before the request (the pool's check). That string is the engine's push count; ``known``
maps it to the trainer's version (``InFlightUpdates``), and a string the trainer did not push is refused. Each token
keeps the log-prob its own version gave: the behaviour policy of the decoupled objective.

The bookkeeping of one response (:class:`Response`, :func:`take`, :func:`request_of`, :func:`after_update`,
:func:`version_of`) is pure; :func:`generate_following` drives the pool. In-process counterpart:
:mod:`rlzoo.engines.vllm.in_flight` (the same rules over vLLM's engine steps).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from rlzoo.engines.base import Generation, InFlightUpdates, SamplingSettings
from rlzoo.engines.vllm_server.client import Completion, ServerClient, ServerError
from rlzoo.engines.vllm_server.pool import Server, ServerPool
from rlzoo.errors import RlzooError

logger = logging.getLogger(__name__)

ABORTED = "abort"  # vLLM's finish reason of a request stopped by /pause?mode=abort or /abort_requests


@dataclass
class Response:
    """One response being sampled, over as many requests as updates interrupt it."""

    prompt: list[int]
    seed: int | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per token, the trainer's version that sampled it
    finished: bool = False  # ended at the end-of-sequence token
    done: bool = False  # ended (by EOS, a stop, or the token budget)


def responses_for(prompts: list[list[int]], n: int, seeds: list[int | None]) -> list[list[Response]]:
    """``n`` responses per prompt; response j of prompt i seeded ``seeds[i] + j`` (vLLM's seed of the j-th sample of
    an n-sample request)."""
    return [
        [Response(list(prompt), None if seed is None else seed + j) for j in range(n)]
        for prompt, seed in zip(prompts, seeds, strict=True)
    ]


def request_of(response: Response, budget: int) -> tuple[list[int], int, int | None]:
    """The request that samples ``response`` on: prompt ids (the prompt and the tokens so far), max tokens (the rest
    of ``budget``), seed."""
    return response.prompt + response.tokens, budget - len(response.tokens), response.seed


def take(response: Response, completion: Completion, version: int, eos: int, budget: int) -> None:
    """Append one request's tokens (sampled by ``version``) and their log-probs; an aborted request leaves the
    response unfinished unless its budget is spent."""
    if len(completion.logprobs) != len(completion.token_ids):
        raise RlzooError(
            f"a rollout server returned {len(completion.token_ids)} tokens but {len(completion.logprobs)} log-probs"
        )
    response.tokens += completion.token_ids
    response.logprobs += completion.logprobs
    response.versions += [version] * len(completion.token_ids)
    if completion.finish_reason != ABORTED or len(response.tokens) >= budget:
        response.done = True
        response.finished = completion.finish_reason == "stop" and bool(response.tokens) and response.tokens[-1] == eos


def after_update(response: Response, mode: Literal["continue", "restart"], new_version: int) -> None:
    """An unfinished response once ``new_version`` is loaded: ``restart`` drops its tokens; either way a fresh seed
    (a continuation must not replay the first request's draws; the in-process engine's rule)."""
    if mode == "restart":
        response.tokens, response.logprobs, response.versions = [], [], []
    if response.seed is not None:
        response.seed = (response.seed * 1_000_003 + new_version + 1) % 2**63


def version_of(reported: str | None, known: dict[str, int], url: str) -> int:
    """The trainer's version of the weights a server reported (``/weight_info``); one it never pushed is refused."""
    if reported not in known:
        raise RlzooError(
            f"rollout server {url} reports weight version {reported!r}, not one this generation pushed "
            f"({', '.join(map(repr, known))}): refused"
        )
    return known[reported]


def generation(response: Response) -> Generation:
    return Generation(
        list(response.prompt), response.tokens, response.logprobs, response.finished, versions=response.versions
    )


def sender(response: Response, stop: threading.Event, budget: int, body: dict[str, Any], model: str) -> Callable:
    """The pool job (``job(client, reported)``) that sends ``response``'s next request to ``model`` with the sampling
    ``body``, unless ``stop`` is set by then (an update is on its way: it is sent after it); ``(url, reported,
    completion)``, or ``None`` when not sent."""

    def send(client: ServerClient, reported: str | None) -> tuple[str, str | None, Completion] | None:
        if stop.is_set():
            return None
        prompt, max_tokens, seed = request_of(response, budget)
        (completion,) = client.complete(prompt, 1, max_tokens, {**body, "seed": seed}, model)
        return client.url, reported, completion

    return send


def generate_following(
    pool: ServerPool,
    prompts: list[list[int]],
    sampling: SamplingSettings,
    seeds: list[int | None],
    updates: InFlightUpdates,
    eos: int,
    options: Callable[[], tuple[dict[str, Any], str]],
    reported_now: Callable[[], str | None],
    poll_s: float = 0.05,
) -> list[list[Generation]]:
    """``sampling.n`` generations per prompt on ``pool`` following ``updates`` in flight. ``seeds``: each prompt's
    (response j: + j); ``options()``: the sampling body and the model to name, asked again after each load (the
    adapter may be new); ``reported_now()``: the version string the servers report now (the trainer's after a
    push)."""
    budget = sampling.max_new_tokens
    groups = responses_for(prompts, sampling.n, seeds)
    responses = [r for group in groups for r in group]
    known = {reported_now(): updates.version()}
    while todo := [r for r in responses if not r.done]:
        stop = threading.Event()
        body, model = options()
        futures = pool.submit([sender(r, stop, budget, body, model) for r in todo], with_version=True)
        interrupted = _wait_or_pending(futures, updates, poll_s)
        paused: list[Server] = []
        try:
            if interrupted:
                stop.set()
                paused = _stop_all(pool, futures)
            for response, future in zip(todo, futures, strict=True):
                answer = future.result()
                if answer is not None:
                    url, reported, completion = answer
                    take(response, completion, version_of(reported, known, url), eos, budget)
            if interrupted:
                new_version = updates.load()
                known = {reported_now(): new_version}  # the only version any later request may report
                for response in (r for r in todo if not r.done):
                    after_update(response, updates.mode, new_version)
        finally:
            _resume(paused)
    return [[generation(r) for r in group] for group in groups]


def _wait_or_pending(futures: list[Future], updates: InFlightUpdates, poll_s: float) -> bool:
    """Wait for every request; ``True`` as soon as newer weights are published while some are still in flight."""
    while True:
        done, pending = wait(futures, timeout=poll_s, return_when=FIRST_EXCEPTION)
        if not pending or any(f.exception() is not None for f in done):
            return False
        if updates.pending():
            return True


def _stop_all(pool: ServerPool, futures: list[Future], retry_s: float = 0.25) -> list[Server]:
    """Pause every live server with its requests aborted, then abort again until every request has answered (one
    sent just after a pause is queued by the paused server, not run). The servers paused, to resume."""
    paused = []
    for server in (s for s in pool.servers if not s.dead):
        try:
            server.client.pause_abort()
            paused.append(server)
        except ServerError as exc:  # a dead one: its requests fail, and the pool restarts it or leaves it out
            logger.warning("rollout server %s did not pause: %s", server.url, exc)
    while wait(futures, timeout=retry_s)[1]:
        for server in (s for s in pool.servers if not s.dead):
            try:
                server.client.abort_all()
            except ServerError:
                pass  # as above: the pool deals with a server that stopped answering
    return paused


def _resume(servers: list[Server]) -> None:
    for server in servers:  # its client now: a server restarted meanwhile has a new one (and is not paused)
        try:
            server.client.resume()
        except ServerError as exc:  # stopped answering since: the pool restarts it (not paused) or leaves it out
            logger.warning("rollout server %s did not resume: %s", server.url, exc)
