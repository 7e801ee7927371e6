"""One vLLM server as rlzoo calls it: completions on token ids, health, and vLLM's RL routes, over HTTP (httpx).

``/v1/completions`` takes the prompt as token ids, ``n`` responses per prompt, and returns each response's sampled
token ids (``return_token_ids``) and the log-prob of each (``logprobs: 0``: the sampled token's only; raw log-probs
because launched servers run with ``--logprobs-mode raw_logprobs``). The weight routes exist on a server started
with ``VLLM_SERVER_DEV_MODE=1`` (``vllm/entrypoints/rl/online/api_router.py``). Every failure is a
:class:`ServerError` naming the server: a connection refused, no reply in time, or an HTTP error with its body.

Reference: vLLM's ``vllm/distributed/weight_transfer/clients.py`` (``HTTPVLLMWeightSyncClient``: the same routes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from rlzoo.engines.base import Generation
from rlzoo.errors import RlzooError

SERVED_MODEL = "policy"  # --served-model-name of a launched server: requests without an adapter name it


class ServerError(RlzooError):
    """A call to a vLLM server that failed; ``unreachable``: no connection at all (refused, reset), which the pool
    answers by restarting or leaving out the server (a timeout is not: the server is slow, not gone)."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass
class Completion:
    """One sampled response: its token ids, their log-probs, and vLLM's finish reason (``stop``, ``length``)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None

    def generation(self, prompt: list[int], eos: int) -> Generation:
        """The response to ``prompt`` as the engine returns it; finished when it ended at ``eos``."""
        if len(self.logprobs) != len(self.token_ids):
            raise RlzooError(
                f"a rollout server returned {len(self.token_ids)} tokens but {len(self.logprobs)} log-probs"
            )
        finished = self.finish_reason == "stop" and bool(self.token_ids) and self.token_ids[-1] == eos
        return Generation(list(prompt), list(self.token_ids), list(self.logprobs), finished)


class ServerClient:
    """Calls one server at ``url`` (``http://host:port``); ``timeout_s``: one request's limit."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def healthy(self, timeout_s: float = 5.0) -> bool:
        try:
            return self.http.get("/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def call(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        """``method path`` with a JSON ``body``; the parsed JSON reply (a plain-text one as text)."""
        try:
            reply = self.http.request(method, path, json=body, timeout=timeout_s or self.timeout_s)
        except httpx.TimeoutException:  # a slow server, not a dead one: the request fails, the server is kept
            raise ServerError(
                f"{self.url}{path}: no reply within {timeout_s or self.timeout_s:g} s "
                "(rollout.engine.request_timeout_s / transfer_timeout_s)"
            ) from None
        except httpx.TransportError as exc:
            raise ServerError(f"{self.url}{path}: {type(exc).__name__}: {exc or 'no connection'}", True) from None
        if reply.status_code >= 400:
            hint = ""
            # runtime LoRA routes are opt-in too (FastAPI's "Not Found": no such route, not no such adapter)
            if reply.status_code == 404 and path.endswith("_lora_adapter") and '"Not Found"' in reply.text:
                hint = (
                    " (LoRA adapters need the server started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)"
                )
            elif reply.status_code == 404 and not path.startswith("/v1/"):  # vLLM's RL routes are opt-in
                hint = (
                    " (vLLM's RL routes need the server started with VLLM_SERVER_DEV_MODE=1 and "
                    "--weight-transfer-config '{\"backend\": \"rlzoo-gloo\"}': `rlzoo serve-rollouts CONFIG` "
                    "prints the whole command)"
                )
            raise ServerError(f"{self.url}{path} answered HTTP {reply.status_code}: {reply.text[:300]}{hint}")
        if not reply.headers.get("content-type", "").startswith("application/json"):
            return reply.text  # the LoRA routes answer with a plain sentence
        return reply.json()

    def complete(
        self, prompt: list[int], n: int, max_tokens: int, sampling: dict[str, Any], model: str = SERVED_MODEL
    ) -> list[Completion]:
        """``n`` responses to ``prompt`` (token ids) of at most ``max_tokens``, in index order, from ``model``: the
        served base model or a LoRA adapter loaded by name (:meth:`load_adapter`)."""
        body = {
            "model": model,
            "prompt": prompt,
            "n": n,
            "max_tokens": max_tokens,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "top_k": 0,
            **sampling,
        }
        reply = self.call("POST", "/v1/completions", body)
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        return [
            Completion(list(c["token_ids"]), [float(x) for x in c["logprobs"]["token_logprobs"]], c["finish_reason"])
            for c in choices
        ]

    def pause_abort(self) -> None:
        """Stop sampling: vLLM aborts the requests it runs (each answers with ``finish_reason`` ``abort`` and what
        it sampled so far), queues new ones until :meth:`resume`, and drops its KV / prefix cache."""
        self.call("POST", "/pause?mode=abort")

    def abort_all(self) -> None:
        """Abort every request the server holds (``/abort_requests`` without ids), queued ones included."""
        self.call("POST", "/abort_requests", {})

    def resume(self) -> None:
        self.call("POST", "/resume")

    def weight_version(self) -> str | None:
        return self.call("GET", "/weight_info")["weight_version"]

    def set_weight_version(self, version: str) -> None:
        """The version the server reports from now on, its weights unchanged (after an adapter is loaded)."""
        self.call("POST", "/update_weight_version", {"new_version": version})

    def load_adapter(self, name: str, folder: str) -> None:
        """Load the peft folder ``folder`` (a path the server reads) as the LoRA adapter requests name ``name``
        (``/v1/load_lora_adapter``: a server started with ``--enable-lora`` and
        ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``); vLLM loads it into its engine before it answers."""
        self.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": folder})

    def unload_adapter(self, name: str) -> None:
        self.call("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def served_context(self) -> int | None:
        """The server's ``max_model_len`` (``/v1/models``)."""
        models = self.call("GET", "/v1/models")["data"]
        return models[0].get("max_model_len") if models else None
