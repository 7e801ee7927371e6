"""The ``remote`` verifier: a reward service over HTTP, in rlzoo's protocol or OpenRLHF's reward-model protocol."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

import rlzoo
from rlzoo.interfaces import Sample, Verdict
from rlzoo.services import ServiceError, ServiceParams, ServiceVerifier


@rlzoo.register("verifier", "remote")
class RemoteVerifier(ServiceVerifier):
    """A reward service's score: each response POSTed with its prompt, answer and metadata to ``url``.

    ``protocol: rlzoo`` (docs/reward-services.md; what ``rlzoo serve-verifier`` answers) sends batches of up to
    ``batch_size`` responses, ``{"items": [{"prompt", "response", "answer", "metadata"}, ...]}``, and reads
    ``{"results": [{"reward": r, "parts": {...}?, "correct": bool?, "info": {...}?, "steps": [...]?, "error": str?},
    ...]}``, one result per item in order (``error``: that item could not be scored; ``steps``: per-step rewards,
    ``[{"reward": r, "span": [start, end]}, ...]``, for the ``process`` advantage). ``protocol: openrlhf`` speaks OpenRLHF's
    reward-model server (``openrlhf/cli/serve_rm.py``): ``{"query": [prompt + response, ...], "prompts": [...],
    "labels": [answer, ...]}`` to ``{"rewards": [r, ...]}``. Either way the reward is the number the service gave;
    one that is missing, not a finite number, or outside ``[min_reward, max_reward]`` (where set) is a verifier
    error, never clipped. ``correct``: the service's flag, else ``reward >= 1``. Calls follow
    :class:`rlzoo.services.ServiceParams`' policy; metrics ``remote/*``.
    """

    metric_prefix = "remote"
    formula = "reward = the service's score of (prompt, response, answer, metadata)"
    reference = "OpenRLHF's remote reward model (--remote_rm_url, openrlhf/cli/serve_rm.py)"
    verl_name = "reward_model (a remote reward function)"

    class Params(ServiceParams):
        url: str = Field(description="the endpoint to POST to, e.g. http://127.0.0.1:8000/verify_batch")
        protocol: Literal["rlzoo", "openrlhf"] = Field("rlzoo", description="the request and reply format")
        health_url: str | None = Field(
            None, description="what the start-up check asks (any HTTP answer counts); null: url itself"
        )
        batch_size: int = Field(16, ge=1, description="responses per request")
        min_reward: float | None = Field(None, description="a smaller reward is a verifier error; null: no bound")
        max_reward: float | None = Field(None, description="a larger reward is a verifier error; null: no bound")

        @model_validator(mode="after")
        def _ordered(self) -> RemoteVerifier.Params:
            if self.min_reward is not None and self.max_reward is not None and self.min_reward > self.max_reward:
                raise ValueError(f"min_reward ({self.min_reward}) is above max_reward ({self.max_reward})")
            return self

    def probe_url(self) -> str:
        return self.params.health_url or self.params.url

    def cache_identity(self) -> tuple[Any, ...]:
        return (self.params.url, self.params.protocol)

    def score_uncached(self, samples: list[Sample], responses: list[str]) -> list[Any]:
        size = self.params.batch_size
        chunks = [(samples[i : i + size], responses[i : i + size]) for i in range(0, len(samples), size)]
        replies = self.client.post_all([(self.params.url, self._request(s, r)) for s, r in chunks])
        results: list[Any] = []
        for (chunk, _), reply in zip(chunks, replies, strict=True):
            if isinstance(reply, Exception):  # every response of the request failed with it
                results += [reply] * len(chunk)
                continue
            try:
                results += self._results(reply, len(chunk))
            except ServiceError as exc:  # a reply, but not one of this protocol
                self.stats.count(failures=1)
                results += [exc] * len(chunk)
        return results

    def _request(self, samples: list[Sample], responses: list[str]) -> dict[str, Any]:
        if self.params.protocol == "openrlhf":
            return {
                "query": [s.prompt + r for s, r in zip(samples, responses, strict=True)],
                "prompts": [s.prompt for s in samples],
                "labels": [s.answer for s in samples],
            }
        return {
            "items": [
                {"prompt": s.prompt, "response": r, "answer": s.answer, "metadata": s.meta}
                for s, r in zip(samples, responses, strict=True)
            ]
        }

    def _results(self, reply: Any, count: int) -> list[Any]:
        """One result (a dict with ``reward``, or a ServiceError) per item of a request of ``count``."""
        key = "rewards" if self.params.protocol == "openrlhf" else "results"
        found = reply.get(key) if isinstance(reply, dict) else None
        if not isinstance(found, list) or len(found) != count:
            raise ServiceError(f"{self.params.url} replied without a list {key!r} of {count} (got {_shape(reply)})")
        if self.params.protocol == "openrlhf":
            return [{"reward": reward} for reward in found]
        results = [
            ServiceError(f"{self.params.url}: {item['error']}")
            if isinstance(item, dict) and item.get("error")
            else item
            for item in found
        ]
        self.stats.count(failures=sum(isinstance(result, ServiceError) for result in results))
        return results

    def verdict(self, result: Any) -> Verdict:
        if not isinstance(result, dict):
            raise ServiceError(f"{self.params.url} gave a result that is not an object: {_shape(result)}")
        reward = _number(result.get("reward"), f"{self.params.url}: reward")
        low, high = self.params.min_reward, self.params.max_reward
        if (low is not None and reward < low) or (high is not None and reward > high):
            raise ServiceError(f"{self.params.url}: reward {reward:g} outside [{low}, {high}] (min_reward, max_reward)")
        parts = result.get("parts")
        if parts is not None:
            if not isinstance(parts, dict):
                raise ServiceError(f"{self.params.url}: parts is not an object: {_shape(parts)}")
            parts = {str(name): _number(value, f"{self.params.url}: part {name!r}") for name, value in parts.items()}
        correct = result.get("correct")
        info = result.get("info")
        reason = info.get("reason") if isinstance(info, dict) and isinstance(info.get("reason"), str) else info
        reason = str(reason)[:200] if reason else None
        step_rewards, step_spans = self._steps(result.get("steps"))
        return Verdict(
            reward,
            correct=bool(correct) if isinstance(correct, bool) else None,
            parts=parts,
            reason=reason,
            step_rewards=step_rewards,
            step_spans=step_spans,
        )

    def _steps(self, steps: Any) -> tuple[list[float] | None, list[tuple[int, int]] | None]:
        """A result's per-step rewards and their character spans (``steps``; absent: none). A step that is not a
        finite ``reward`` with a ``span`` of two ordered character offsets makes the result unusable (the
        ``process`` advantage places each reward at its span's last token, so a reward without one cannot be used)."""
        if steps is None:
            return None, None
        where = f"{self.params.url}: steps"
        if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
            raise ServiceError(f"{where} is not a list of objects: {_shape(steps)}")
        rewards = [_number(step.get("reward"), f"{where}[{k}].reward") for k, step in enumerate(steps)]
        spans = [step.get("span") for step in steps]
        for k, span in enumerate(spans):
            if not (
                isinstance(span, list)
                and len(span) == 2
                and all(type(x) is int for x in span)
                and 0 <= span[0] <= span[1]
            ):
                raise ServiceError(
                    f"{where}[{k}].span is not [start, end] character offsets, 0 <= start <= end: {_shape(span)}"
                )
        return rewards, [(span[0], span[1]) for span in spans]


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ServiceError(f"{what} is not a finite number: {_shape(value)}")
    return float(value)


def _shape(value: Any) -> str:
    text = repr(value)
    return text[:80] + ("..." if len(text) > 80 else "")
