"""The DeepSpeed engine's MoE layout, decided once from ``trainer.engine.moe``: the model's own blocks or DeepSpeed-MoE.

:func:`moe_blocks` picks the strategy when the engine is built; every step that differs between the two layouts (the
settings each allows, the start-up checks, the memory layout, converting the model at start, the optimizer's
parameter groups, the Hugging Face view of the weights) asks it instead of testing the config.

- :class:`ModelMoe` (``moe: none``): the model's sparse MoE blocks, as transformers builds them, train as any other
  parameter; a dense model is held the same way.
- :class:`DeepSpeedMoe` (``moe: deepspeed``): the blocks are converted by
  :func:`rlzoo.models.deepspeed_moe.convert_to_deepspeed_moe` into DeepSpeed-MoE layers (expert parallelism over
  ``ep_size`` ranks, experts as linear layers, DeepSpeed's expert optimizer groups), and swapped back into the
  Hugging Face layout whenever the weights are read or written as a checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch import nn

from rlzoo.interfaces import Problem, RunFacts
from rlzoo.models.memory import TrainingLayout


class ModelMoe:
    """``moe: none``: the model's own MoE blocks (or a dense model), trained as they are."""

    name = "none"
    #: the optimizer splits DeepSpeed's dense / expert parameter groups (expert gradients reduced over their group)
    expert_groups = False
    #: the live module's parameters are already the checkpoint's (no block to swap back before reading them)
    in_checkpoint_layout = True

    # -- the settings this layout allows (config validation) ------------------------------------------------------

    def zero_stage_problem(self, stage: int) -> str | None:
        return None

    def ep_size_problem(self, ep_size: int) -> str | None:
        if ep_size > 1:
            return f"{ep_size} needs moe: deepspeed; with moe: none use 1"
        return None

    # -- the start-up check (before start) -------------------------------------------------------------------

    def model_problems(self, run: RunFacts, at: str) -> list[Problem]:
        """What this layout needs of the model."""
        return []

    def lora_problems(self, run: RunFacts, at: str, zero_stage: int) -> list[Problem]:
        """What this layout needs under ``model.lora`` beyond what every layout needs."""
        return []

    def adapter_targets_problem(self, fused_parameters: list[str]) -> str | None:
        return None

    def memory_layout(self, zero_stage: int, ep_size: int) -> TrainingLayout:
        return TrainingLayout(zero_stage, 1, experts_as_linear=False)

    def memory_hint(self, zero_stage: int, ep_size: int) -> str:
        if zero_stage < 3:
            return f"raise trainer.engine.zero_stage (now {zero_stage}), and run more processes"
        return "run more processes (ZeRO-3 partitions them over every rank)"

    # -- start and the weights ------------------------------------------------------------------------------------

    def convert(self, model: nn.Module, ep_size: int, model_dir: Path, lora: bool) -> None:
        """Bring the freshly loaded model into this layout (before ``deepspeed.initialize``)."""

    @contextmanager
    def hf_view(self, model: nn.Module, write_back: bool) -> Iterator[nn.Module]:
        """The model in the Hugging Face layout; ``write_back``: changes made inside are kept on exit."""
        yield model


class DeepSpeedMoe(ModelMoe):
    """``moe: deepspeed``: the MoE blocks converted to DeepSpeed-MoE layers, expert-parallel over ``ep_size`` ranks."""

    name = "deepspeed"
    expert_groups = True
    in_checkpoint_layout = False

    def zero_stage_problem(self, stage: int) -> str | None:
        if stage == 3:
            return (
                "3 cannot run DeepSpeed-MoE (moe: deepspeed; DeepSpeed rejects native MoE at ZeRO-3): use 0, 1 "
                "or 2, or moe: none"
            )
        return None

    def ep_size_problem(self, ep_size: int) -> str | None:
        return None

    def model_problems(self, run: RunFacts, at: str) -> list[Problem]:
        if run.model.moe is False:
            hint = (
                "model.path: a mixture-of-experts model"
                if run.config.model.path
                else "model.tiny.architecture: qwen3_moe"
            )
            return [(f"{at}.moe", f"'deepspeed' converts MoE blocks but the model is dense: use 'none', or set {hint}")]
        return []

    def lora_problems(self, run: RunFacts, at: str, zero_stage: int) -> list[Problem]:
        if zero_stage in (1, 2):
            return [
                (
                    f"{at}.zero_stage",
                    f"{zero_stage} with moe: deepspeed needs trainable experts (DeepSpeed's ZeRO 1-2 optimizer asserts an "
                    "expert parameter group), but under model.lora the experts are frozen: use moe: none (the adapters "
                    "may then target the experts too), or zero_stage 0",
                )
            ]
        return []

    def adapter_targets_problem(self, fused_parameters: list[str]) -> str | None:
        if fused_parameters:
            return (
                f"{fused_parameters} are the fused experts of transformers' MoE blocks, which moe: deepspeed "
                "replaces with DeepSpeed-MoE experts: target attention only, or use trainer.engine.moe: none"
            )
        return None

    def memory_layout(self, zero_stage: int, ep_size: int) -> TrainingLayout:
        return TrainingLayout(zero_stage, ep_size, experts_as_linear=True)

    def memory_hint(self, zero_stage: int, ep_size: int) -> str:
        return (
            f"raise trainer.engine.ep_size (now {ep_size}) with more processes, or "
            f"trainer.engine.zero_stage (now {zero_stage}; DeepSpeed-MoE allows 0-2)"
        )

    def convert(self, model: nn.Module, ep_size: int, model_dir: Path, lora: bool) -> None:
        from rlzoo.models.deepspeed_moe import convert_to_deepspeed_moe

        if convert_to_deepspeed_moe(model, ep_size) == 0:
            raise ValueError(f"moe=deepspeed: {model_dir} has no sparse MoE blocks to convert")
        if lora:
            from rlzoo.engines.lora import freeze_base

            freeze_base(model)  # the conversion built new (trainable) expert weights; the adapters alone train

    @contextmanager
    def hf_view(self, model: nn.Module, write_back: bool) -> Iterator[nn.Module]:
        from rlzoo.models.deepspeed_moe import hf_layout

        with hf_layout(model, write_back=write_back):
            yield model


LAYOUTS: dict[str, ModelMoe] = {layout.name: layout for layout in (ModelMoe(), DeepSpeedMoe())}


def moe_blocks(moe: str) -> ModelMoe:
    """The layout named by ``trainer.engine.moe``."""
    return LAYOUTS[moe]
