"""A live transformers model's weights under Hugging Face *checkpoint* names: what ``save_pretrained`` writes.

transformers 5 keeps some weights in a different layout in memory than on disk. For MoE models the experts are
fused (``model.layers.0.mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``...experts.down_proj`` ``[E, H, I]``) while
checkpoints, vLLM and every other consumer use per-expert names (``model.layers.0.mlp.experts.0.gate_proj.weight``,
``up_proj``, ``down_proj``). ``save_pretrained`` translates back with transformers' own
``revert_weight_conversion``; :func:`checkpoint_weights` runs the same steps without writing a file, so weight sync
sends exactly the names and values a saved checkpoint holds (``tests/test_export.py`` checks this against the file).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


@torch.no_grad()
def checkpoint_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` exactly as ``model.save_pretrained`` would write them (names and values).

    The tensors are detached and may share storage with the model's parameters (or be views of them): consumers
    copy them before the next optimizer step changes the model. Tied weights appear once, under the name the
    checkpoint keeps.
    """
    return checkpoint_state(model, model.state_dict())


@torch.no_grad()
def checkpoint_state(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`checkpoint_weights` of ``state_dict``, a state of ``model`` under its in-memory names (e.g. with LoRA
    adapters merged in, :func:`rlzoo.engines.lora.merged_weights`)."""
    ignore = getattr(model, "_keys_to_ignore_on_save", None) or ()
    for key in ignore:
        state_dict.pop(key, None)
    try:
        from transformers.core_model_loading import revert_weight_conversion
        from transformers.modeling_utils import remove_tied_weights_from_state_dict
    except ImportError:  # an older or a future transformers without these helpers
        yield from _fallback(model, state_dict)
        return
    state_dict = remove_tied_weights_from_state_dict(state_dict, model)
    for name, tensor in revert_weight_conversion(model, state_dict).items():
        yield name, tensor.detach()


def _fallback(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Per-expert split of fused Qwen3-MoE-style experts, for transformers releases without the helpers above."""
    tied = set()
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        tied.add("lm_head.weight")
    for name, tensor in state_dict.items():
        if name in tied:
            continue
        if name.endswith(".experts.gate_up_proj"):
            prefix = name[: -len(".gate_up_proj")]
            half = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                yield f"{prefix}.{e}.gate_proj.weight", tensor[e, :half]
                yield f"{prefix}.{e}.up_proj.weight", tensor[e, half:]
        elif name.endswith(".experts.down_proj"):
            prefix = name[: -len(".down_proj")]
            for e in range(tensor.shape[0]):
                yield f"{prefix}.{e}.down_proj.weight", tensor[e]
        else:
            yield name, tensor
