"""A policy's LoRA adapters as one object: what a training engine hands a rollout engine that loads adapters."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file


@dataclass
class Adapter:
    """A policy's LoRA adapters as peft saves them (``adapter_config.json`` + ``adapter_model.safetensors``).

    config:  the peft ``LoraConfig`` as a dict (what ``adapter_config.json`` holds; ``target_modules`` and
             ``target_parameters`` name the base model's modules and parameters).
    tensors: ``get_peft_model_state_dict`` of the policy: keys as peft writes them, e.g.
             ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``.
    version: how many times adapters were sent before (a rollout engine that caches adapters by id needs a new
             id for new weights).
    """

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    version: int = 0

    def save(self, directory: Path) -> Path:
        """Write the adapters as a peft folder (``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load it)."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "adapter_config.json").write_text(json.dumps(self.config, indent=2, default=list))
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in self.tensors.items()},
            str(directory / "adapter_model.safetensors"),
        )
        return directory
