"""Where the in-process engines run (``device`` in the config), and the GPU's peak memory as a step metric.

``auto`` is cuda when torch sees a GPU, else cpu. Several processes use their own rank's GPU (the distributed setup
sets torch's current device to the local rank). DeepSpeed places its engines itself and vLLM by its build; the hf
rollout engine and the torch training engines follow this setting.
"""

from __future__ import annotations

import torch

from rlzoo.errors import RlzooError

NO_GPU = "cuda, but torch sees no GPU here (allowed: auto, cpu, cuda; auto runs on the CPU)"


def resolve_device(setting: str) -> str:
    """``"cpu"`` or ``"cuda:<index>"`` for the config's ``device`` (``auto``, ``cpu`` or ``cuda``)."""
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        raise RlzooError(f"device: {NO_GPU}")
    return f"cuda:{torch.cuda.current_device()}"


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device`` without the host waiting for the device: a copy from the CPU's pageable memory is
    staged before the call returns (so the source may change at once), and a copy back to the CPU is not made here."""
    return tensor.to(device, non_blocking=True)


def device_memory_metrics() -> dict[str, float]:
    """``memory/gpu_peak_gb`` (10^9 bytes): the most GPU memory torch's allocator held at once since the last call,
    then the peak is reset, so each step reports its own; nothing on a run that never touched a GPU."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    peak = torch.cuda.max_memory_allocated() / 1e9
    reserved = torch.cuda.max_memory_reserved() / 1e9
    torch.cuda.reset_peak_memory_stats()
    return {"memory/gpu_peak_gb": peak, "memory/gpu_reserved_peak_gb": reserved}
