"""``rlzoo serve-verifier``: any verifier over HTTP in rlzoo's protocol, so scoring can run on another machine.

FastAPI on uvicorn (the ``serve`` extra; vLLM installs both already, so a machine that generates has them): its
request models validate a batch before the verifier sees it (a malformed request gets HTTP 422 naming the field),
and a plain ``def`` route runs in uvicorn's thread pool, which suits verifiers that block (the ``code`` sandbox
waits on subprocesses). The protocol (docs/reward-services.md):

- ``GET /health`` -> ``{"status": "ok", "verifier": NAME}``;
- ``POST /verify_batch`` ``{"items": [{"prompt", "response", "answer", "metadata"}, ...]}`` ->
  ``{"results": [{"reward", "correct", "parts", "info": {"reason"}} or {"error": "..."}, ...]}``, in order; a
  verdict with step rewards (a process verifier's) adds ``"steps": [{"reward": r, "span": [start, end]}, ...]``,
  each span in characters (Unicode code points) of the response;
- ``POST /verify`` one item -> one result.

A response the verifier cannot score (it raised, or gave a reward that is not a finite number) gets ``{"error"}``
in its place, never a reward; the ``remote`` verifier counts it in ``verifier/errors``. At most ``concurrency``
batches are scored at once (the verifier is called from that many threads).
"""

from __future__ import annotations

import math
import threading
from typing import Any

from pydantic import BaseModel, Field

from rlzoo.errors import RlzooError
from rlzoo.interfaces import Sample, Verdict, Verifier

INSTALL = "pip install 'rlzoo[serve]' (fastapi and uvicorn)"


class Item(BaseModel):
    """One response to score, as the protocol sends it."""

    prompt: str
    response: str
    answer: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    messages: list[dict[str, str]] | None = None


class Batch(BaseModel):
    items: list[Item]


def app_for(verifier: Verifier, concurrency: int = 4) -> Any:
    """The FastAPI application serving ``verifier``."""
    try:
        from fastapi import FastAPI
    except ImportError as exc:
        raise RlzooError(f"rlzoo serve-verifier needs the serve extra ({exc.name} is missing): {INSTALL}") from None

    slots = threading.BoundedSemaphore(concurrency)
    app = FastAPI(title=f"rlzoo verifier {verifier.name}")

    def results(items: list[Item]) -> list[dict[str, Any]]:
        samples = [Sample(prompt=i.prompt, answer=i.answer, meta=i.metadata, messages=i.messages) for i in items]
        with slots:
            outcomes = _verify(verifier, samples, [i.response for i in items])
            verifier.take_phase_metrics()  # nobody reads them here; they must not pile up
        return [_result(outcome) for outcome in outcomes]

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "verifier": verifier.name}

    @app.post("/verify_batch")
    def verify_batch(batch: Batch) -> dict[str, Any]:
        return {"results": results(batch.items)}

    @app.post("/verify")
    def verify(item: Item) -> dict[str, Any]:
        return results([item])[0]

    return app


def serve(app: Any, host: str, port: int) -> None:
    """Serve ``app`` (:func:`app_for`) on ``host:port`` until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise RlzooError(f"rlzoo serve-verifier needs the serve extra (uvicorn is missing): {INSTALL}") from None
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _verify(verifier: Verifier, samples: list[Sample], responses: list[str]) -> list[Verdict | Exception]:
    """``verify_batch``, or one ``verify`` per response when it raises (so one bad response fails alone)."""
    try:
        outcomes = verifier.verify_batch(samples, responses)
        if len(outcomes) == len(responses):
            return outcomes
    except Exception:
        pass
    outcomes: list[Verdict | Exception] = []
    for sample, response in zip(samples, responses, strict=True):
        try:
            outcomes.append(verifier.verify(sample, response))
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


def _result(outcome: Verdict | Exception) -> dict[str, Any]:
    if isinstance(outcome, Exception):
        return {"error": f"{type(outcome).__name__}: {outcome}"}
    numbers = [outcome.reward, *(outcome.parts or {}).values(), *(outcome.step_rewards or [])]
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in numbers):
        return {"error": f"the verifier gave a reward that is not a finite number: {outcome.reward!r}"}
    result = {
        "reward": outcome.reward,
        "correct": outcome.correct,
        "parts": outcome.parts,
        "info": {"reason": outcome.reason} if outcome.reason else None,
    }
    if outcome.step_rewards is not None:
        spans = outcome.step_spans or []
        if len(spans) != len(outcome.step_rewards):
            return {"error": f"the verifier gave {len(outcome.step_rewards)} step rewards and {len(spans)} step spans"}
        result["steps"] = [{"reward": reward, "span": list(span)} for reward, span in zip(outcome.step_rewards, spans)]
    return result
