"""The core's own engines, registered through the same entry-point group as every plugin."""

from __future__ import annotations

from rlzoo.hookspecs import hookimpl


@hookimpl
def rlzoo_rollout_engines() -> list[type]:
    from rlzoo.engines.hf_rollout import HFRolloutEngine

    engines: list[type] = [HFRolloutEngine]
    try:
        from rlzoo.engines.vllm.rollout import VLLMRolloutEngine
    except ImportError:  # the module itself imports vllm lazily; absent only in a partial checkout
        pass
    else:
        engines.append(VLLMRolloutEngine)
    from rlzoo.engines.vllm_server.rollout import VllmServerRolloutEngine

    engines.append(VllmServerRolloutEngine)  # vLLM is needed only by the servers it calls (or launches)
    return engines


@hookimpl
def rlzoo_training_engines() -> list[type]:
    from rlzoo.engines.deepspeed.trainer import DeepSpeedTrainingEngine
    from rlzoo.engines.torch_trainer import TorchTrainingEngine

    return [TorchTrainingEngine, DeepSpeedTrainingEngine]
