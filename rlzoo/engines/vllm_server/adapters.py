"""LoRA adapters sent to vLLM servers as adapters: each sync a peft folder the servers read, loaded under a new name.

When the run sends adapters (``EngineContext.sends_adapters``: ``model.lora`` with ``sync`` not ``merged``, decided
once by :func:`rlzoo.engines.lora.sends_adapters`), the servers run with ``--enable-lora`` on the adapters' targets
(``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``, so vLLM serves ``/v1/load_lora_adapter``). Each sync writes the adapter as
peft saves it (:meth:`rlzoo.engines.base.Adapter.save`, as the in-process engine does) into a folder of its own,
named ``rlzoo-<token>-v<version>`` (``token``: random per engine, so two trainers of one server never share a name),
and every server loads it under that name (vLLM reads the folder into its engine before it answers), reports the
sync's version (``/update_weight_version``, which the pool checks before every request) and unloads the previous
adapter; the previous folder is removed then. From then on every request names the adapter as its ``model``, so a
server that lacks it answers an error rather than sampling the base model. Until the first sync, requests name the
served base model (``policy``): the adapters start at ``B = 0``.

Where the folders are: a temporary folder on this machine for launched servers; for servers started elsewhere
(``servers``) a path on this machine is not on theirs, so ``rollout.engine.adapter_folder`` names a folder every
server reads at the same path (a shared filesystem); without it, adapter sync is refused for ``servers`` by the
engine's start-up check (``sync: auto`` then sends the merged weights).

What vLLM serves on which targets (attention and dense-MLP projections; no expert adapters) is the in-process
engine's (:mod:`rlzoo.engines.vllm.lora`); on CPU a launched LoRA server's fused-MoE layers keep the CPU kernel
through rlzoo's vLLM plugin (:data:`rlzoo.engines.vllm.lora.CPU_MOE_LORA_ENV`).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from rlzoo.engines.vllm.lora import max_lora_rank
from rlzoo.engines.vllm_server.client import SERVED_MODEL, ServerClient, ServerError

if TYPE_CHECKING:
    from rlzoo.config.schema import LoraConfig
    from rlzoo.engines.base import Adapter


def lora_arguments(lora: LoraConfig) -> list[str]:
    """vLLM server arguments for one adapter at a time of ``lora``'s rank on its targets (and nothing else: an MoE
    model's experts stay unwrapped); as the in-process engine's :func:`rlzoo.engines.vllm.lora.build_kwargs`."""
    targets = sorted({t.rpartition(".")[2] for t in lora.target_modules})
    return [
        "--enable-lora",
        "--max-loras",
        "1",
        "--max-lora-rank",
        str(max_lora_rank(lora.rank)),
        "--lora-target-modules",
        *targets,
    ]


class ServerAdapters:
    """The adapter the servers serve now, its folder under ``root``, and how each sync reaches them."""

    def __init__(self, shared_folder: Path | None) -> None:
        self.token = secrets.token_hex(4)
        self._temporary = None
        if shared_folder is None:  # launched servers read this machine's files
            self._temporary = tempfile.TemporaryDirectory(prefix="rlzoo-server-adapters-")
            self.root = Path(self._temporary.name)
        else:
            self.root = Path(shared_folder).resolve() / f"rlzoo-{self.token}"
            self.root.mkdir(parents=True, exist_ok=True)
        self.name: str | None = None  # the adapter every request names (None: the base model)
        self.folder: Path | None = None

    @property
    def model(self) -> str:
        """What a completion request names as its ``model``."""
        return self.name or SERVED_MODEL

    def sync(self, clients: list[ServerClient], adapter: Adapter, version: str) -> list[tuple[ServerClient, Exception]]:
        """Write ``adapter`` and load it on every server of ``clients``, each then reporting ``version``; the failures
        (server, error), the servers that loaded it being switched all the same."""
        name = f"rlzoo-{self.token}-v{version}"
        folder = adapter.save(self.root / name)
        previous, previous_folder = self.name, self.folder
        self.name, self.folder = name, folder
        with ThreadPoolExecutor(max(len(clients), 1), thread_name_prefix="rlzoo-adapter") as calls:
            results = list(calls.map(lambda c: self._switch(c, version, previous), clients))
        if previous_folder is not None:
            shutil.rmtree(previous_folder, ignore_errors=True)
        return [(client, error) for client, error in zip(clients, results, strict=True) if error is not None]

    def catch_up(self, client: ServerClient, version: str) -> None:
        """A restarted server (it holds no adapter): load the current one, report ``version``."""
        if self.name is not None:
            error = self._switch(client, version, None)
            if error is not None:
                raise error

    def _switch(self, client: ServerClient, version: str, previous: str | None) -> Exception | None:
        try:
            client.load_adapter(self.model, str(self.folder))
            client.set_weight_version(version)
        except ServerError as exc:
            return exc
        if previous is not None:
            try:
                client.unload_adapter(previous)
            except ServerError:  # not there (a restarted server): nothing to unload; vLLM evicts it anyway
                pass
        return None

    def close(self) -> None:
        if self._temporary is not None:
            self._temporary.cleanup()
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        self.name = self.folder = None
