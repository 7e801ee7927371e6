"""LoRA adapters on a policy through peft: wrapping, the merged weights, the adapters, and a merged export.

``model.lora.target_modules`` names modules or parameters by suffix. A name that ends a module's path wraps that
``nn.Linear`` (peft's ``target_modules``: attention's ``q_proj``..``o_proj``, a dense MLP's ``gate_proj``, ``up_proj``,
``down_proj``); a name that ends a parameter's path wraps that parameter (peft's ``target_parameters``): the fused
experts of a transformers 5 mixture-of-experts block, ``experts.gate_up_proj`` ``[E, 2I, H]`` and
``experts.down_proj`` ``[E, H, I]``, each expert with its own ``A`` and ``B``. The router (``mlp.gate``), norms and
embeddings are never targets.

Only the adapters train: :func:`wrap` freezes every base weight. Weight sync and export need the policy as a plain
model: :func:`merged_weights` computes ``W + scale * B A`` out of place, so the base weights stay bit-exact (the KL
reference is the base with the adapters disabled, and a resumed run reloads the base from its folder).

:func:`lora_rule` is the start-up check of ``model.lora`` (the preflight runs it from :mod:`rlzoo.preflight.rules`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlzoo.errors import ConfigError, RlzooError
from rlzoo.util.safetensors_header import HeaderProblem, read_header

if TYPE_CHECKING:
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel

    from rlzoo.config.schema import LoraConfig
    from rlzoo.engines.base import Adapter, RolloutEngine
    from rlzoo.interfaces import Problem, RunFacts

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # peft's names, in model/
#: linear modules that are no layer's projection (the output layer, MoE routers): never targets, whatever a name says
NEVER_TARGETED = frozenset({"lm_head", "gate", "router", "score"})


def sends_adapters(rollout: RolloutEngine, lora: LoraConfig | None, moe: bool) -> bool:
    """The one rule for what a rollout engine receives under LoRA: the adapters, unless ``model.lora.sync: merged``
    or the engine refuses the targets on this (``moe``: mixture-of-experts) model; else the merged weights. The run
    decides it once and tells the learner and the engine (``EngineContext.sends_adapters``)."""
    if lora is None or lora.sync == "merged":
        return False
    return rollout.adapter_targets_supported(list(lora.target_modules), moe) is None


def split_targets(model: torch.nn.Module, names: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``names`` as peft's ``(target_modules, target_parameters, unknown)`` for ``model``: names that end the path of
    a linear projection, names that end the path of a fused 3-d expert parameter, and names that end neither (peft
    matches both kinds by the same suffix rule)."""
    linear, fused = _projections(model)
    modules, parameters, unknown = [], [], []
    for name in names:
        if any(_ends_with(path, name) for path in linear):
            modules.append(name)
        elif any(_ends_with(path, name) for path in fused):
            parameters.append(name)
        else:
            unknown.append(name)
    return modules, parameters, unknown


def target_names(model: torch.nn.Module) -> list[str]:
    """The shortest names ``model.lora.target_modules`` accepts for ``model`` (error messages, the docs)."""
    linear, fused = _projections(model)
    return sorted({path.rsplit(".", 1)[-1] for path in linear}) + sorted({".".join(p.split(".")[-2:]) for p in fused})


def _projections(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    linear = [
        path
        for path, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and path.rsplit(".", 1)[-1] not in NEVER_TARGETED
    ]
    # a ZeRO-3 partitioned parameter is flat: its shape is ds_shape
    fused = [path for path, param in model.named_parameters() if len(getattr(param, "ds_shape", param.shape)) == 3]
    return linear, fused


def _ends_with(path: str, name: str) -> bool:
    return path == name or path.endswith("." + name)


def skeleton(model_dir: Path | None, tiny: Any = None) -> torch.nn.Module:
    """The model of ``model_dir`` (or of the ``model.tiny`` settings) on the meta device: its modules and parameter
    shapes, no weights (what the start-up check matches ``target_modules`` against)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlzoo.models.tiny import tiny_config_for_vocab

    config = AutoConfig.from_pretrained(model_dir) if model_dir is not None else tiny_config_for_vocab(tiny, 64)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def peft_config(lora: LoraConfig, model: torch.nn.Module, base: Path | None = None) -> PeftLoraConfig:
    """peft's ``LoraConfig`` for ``model`` (``base``: the folder written as ``base_model_name_or_path``)."""
    from peft import LoraConfig as PeftLoraConfig

    modules, parameters, unknown = split_targets(model, lora.target_modules)
    if unknown:
        raise ValueError(
            f"model.lora.target_modules: {unknown} name no projection of {type(model).__name__}; "
            f"use some of {target_names(model)}"
        )
    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=modules or None,
        target_parameters=parameters or None,
        base_model_name_or_path=str(base) if base is not None else None,
    )


def wrap(model: torch.nn.Module, lora: LoraConfig, seed: int, base: Path | None = None) -> PeftModel:
    """``model`` with fresh adapters (``A`` drawn with ``seed``, ``B = 0``: the wrapped model is the base model)
    and every base weight frozen."""
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, peft_config(lora, model, base))
    freeze_base(wrapped)
    return wrapped


def freeze_base(model: torch.nn.Module) -> None:
    """Train the adapters only (again after a conversion that built new base modules, e.g. DeepSpeed-MoE's)."""
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)


def adapter(model: PeftModel, version: int = 0) -> Adapter:
    """The adapters of ``model`` as peft saves them (tensors detached, on the CPU)."""
    from peft import get_peft_model_state_dict

    from rlzoo.engines.base import Adapter

    tensors = {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(model).items()}
    config = model.peft_config["default"].to_dict()
    return Adapter(config=_jsonable(config), tensors=tensors, version=version)


def _jsonable(config: dict) -> dict:
    return {k: sorted(v) if isinstance(v, set) else (v.value if hasattr(v, "value") else v) for k, v in config.items()}


def load_adapter(model: PeftModel, directory: Path) -> None:
    """Load the adapters a checkpoint's ``model/`` folder holds (``PeftModel.save_pretrained``) into ``model``."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = Path(directory) / ADAPTER_WEIGHTS
    if not file.is_file():
        raise FileNotFoundError(f"{directory} holds no adapter_model.safetensors: not a LoRA checkpoint")
    result = set_peft_model_state_dict(model, load_file(str(file)))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing:
        raise KeyError(f"{file} lacks {len(missing)} adapter weights of this model, e.g. {missing[:2]}")


@torch.no_grad()
def merged_state(model: PeftModel) -> dict[str, torch.Tensor]:
    """The base model's state under its own (in-memory) names with every adapter merged in, out of place."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    prefix = "base_model.model."
    for path, module in model.named_modules():
        if isinstance(module, LoraLayer) and not module.disable_adapters and "default" in module.lora_A:
            owner = path.removeprefix(prefix).replace(".base_layer", "")
            name = getattr(module, "parameter_name", None) or "weight"
            deltas[f"{owner}.{name}"] = module.get_delta_weight("default")
    state = {}
    for key, tensor in model.get_base_model().state_dict().items():
        if "lora_" in key:
            continue
        name = key.replace(".base_layer", "")
        state[name] = tensor + deltas[name].to(tensor.dtype) if name in deltas else tensor
    return state


def merged_weights(model: PeftModel) -> Iterator[tuple[str, torch.Tensor]]:
    """The merged policy under Hugging Face checkpoint names (what a rollout engine loads, what export writes)."""
    from rlzoo.models.export import checkpoint_state

    return checkpoint_state(model.get_base_model(), merged_state(model))


def export_merged(adapter_dir: Path, output: Path, base: Path | None = None) -> Path:
    """A plain Hugging Face folder at ``output`` with the adapters of ``adapter_dir`` merged into their base (``base``,
    the ``--base`` flag, or the folder ``adapter_config.json`` records), written whole or not at all
    (:func:`rlzoo.runtime.checkpoint.files.atomic_directory`). Before anything is written, refused with one line
    (:class:`rlzoo.errors.RlzooError`) naming the file: an adapter config that is no readable LoRA config; adapter
    weights that are damaged (:func:`rlzoo.util.safetensors_header.read_header`) or not finite; a base that is no
    whole model folder (:class:`rlzoo.models.folder.ModelFolder`), of another model class than the adapters record,
    or whose shapes do not fit the adapters (:func:`fit_problem`)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    from rlzoo.models import load_model
    from rlzoo.runtime.checkpoint.files import atomic_directory, one_line

    adapter_dir = Path(adapter_dir)
    config_file, weights_file = adapter_dir / ADAPTER_CONFIG, adapter_dir / ADAPTER_WEIGHTS
    recorded = read_adapter_config(config_file)
    shapes = _adapter_shapes(weights_file)
    base_dir, base_name = _base(recorded, config_file, base)
    try:
        lora = PeftLoraConfig.from_pretrained(str(adapter_dir))
        model, tokenizer = load_model(base_dir, "float32")
    except Exception as err:  # a library's error on a file that passed the checks above: one line, naming both
        problem = one_line(err)
        raise RlzooError(f"export: the adapters of {adapter_dir} could not be put on {base_name}: {problem}") from err
    lora.base_model_name_or_path = model.name_or_path  # --base: peft would warn of the rename; the file told already
    try:
        with torch.random.fork_rng(devices=[]):  # fresh adapters, replaced by the file's below
            wrapped = get_peft_model(model, lora)
    except ValueError as err:  # peft: "Target modules ... not found in the base model"
        raise RlzooError(
            f"export: {base_name} does not fit the adapters of {adapter_dir}: {one_line(err)}; pass "
            f"--base the model they were trained on"
        ) from err
    problem = fit_problem(shapes, {k: tuple(v.shape) for k, v in get_peft_model_state_dict(wrapped).items()})
    if problem:
        raise RlzooError(
            f"export: {base_name} does not fit the adapters in {weights_file}: {problem}; pass --base the "
            f"model they were trained on ({recorded.get('base_model_name_or_path') or 'not recorded'})"
        )
    set_peft_model_state_dict(wrapped, _finite_tensors(weights_file))
    merged = wrapped.merge_and_unload()
    try:
        with atomic_directory(Path(output)) as folder:
            merged.save_pretrained(folder, safe_serialization=True)
            tokenizer.save_pretrained(folder)
    except Exception as err:  # a full disk, a quota, a permission: the temporary folder is gone, output untouched
        raise RlzooError(f"export: could not write {output}: {one_line(err)}; nothing was written") from err
    return Path(output)


def read_adapter_config(file: Path) -> dict[str, Any]:
    """A peft ``adapter_config.json`` as a dict; :class:`RlzooError` naming it when it is missing or no JSON object."""
    try:
        config = json.loads(Path(file).read_text())
    except FileNotFoundError as err:
        raise RlzooError(f"export: {file.parent} holds no LoRA adapters (no {ADAPTER_CONFIG})") from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RlzooError(f"export: {file} is not readable JSON ({type(err).__name__}: {err})") from err
    if not isinstance(config, dict):
        raise RlzooError(f"export: {file} is not a JSON object (not a peft adapter config)")
    return config


def fit_problem(adapters: dict[str, tuple[int, ...]], needed: dict[str, tuple[int, ...]]) -> str | None:
    """How the adapter tensors (name -> shape, as saved) differ from those a base model needs (``None``: they fit):
    tensors of another shape (both shapes named), tensors for modules the base lacks, adapted modules of the base
    that the adapters hold nothing for (a deeper model)."""
    other = sorted(k for k in adapters.keys() & needed.keys() if adapters[k] != needed[k])
    if other:
        key = other[0]
        return (
            f"{len(other)} of {len(adapters)} adapter tensors have another shape than this base needs, e.g. {key} "
            f"is {list(adapters[key])} in the adapters and {list(needed[key])} for this base"
        )
    extra, missing = sorted(adapters.keys() - needed.keys()), sorted(needed.keys() - adapters.keys())
    if extra:
        return f"the adapters hold {len(extra)} tensors for modules this base lacks, e.g. {extra[0]}"
    if missing:
        return f"this base has {len(missing)} adapted weights the adapters hold nothing for, e.g. {missing[0]}"
    return None


def _adapter_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """The adapter tensors' shapes from the file's header (nothing loaded); :class:`RlzooError` when it is missing or
    damaged."""
    if not file.is_file():
        raise RlzooError(f"export: {file.parent} holds no {ADAPTER_WEIGHTS}: not a LoRA checkpoint")
    try:
        return {name: info.shape for name, info in read_header(file).items()}
    except (HeaderProblem, OSError) as err:
        raise RlzooError(f"export: {file} is damaged: {err}; export another checkpoint, or restore the file") from err


def _finite_tensors(file: Path) -> dict[str, torch.Tensor]:
    """The adapter tensors, every value finite (a flipped exponent bit in a file without digests shows here)."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(file))
    except Exception as err:  # what a header cannot show, e.g. a dtype this safetensors does not know
        raise RlzooError(f"export: {file} could not be read: {' '.join(str(err).split())}") from err
    bad = sorted(name for name, tensor in tensors.items() if not torch.isfinite(tensor).all())
    if bad:
        raise RlzooError(
            f"export: {file} holds values that are not finite (NaN or infinite) in {len(bad)} tensors, "
            f"e.g. {bad[0]}: a damaged file, or adapters of a run that diverged; export an earlier "
            "checkpoint"
        )
    return tensors


def _base(recorded: dict[str, Any], config_file: Path, flag: Path | None) -> tuple[Path, str]:
    """The base model folder and how messages name it; :class:`RlzooError` when it is no whole model folder (the
    policy's check) or of another model class than the adapters record (peft's ``auto_mapping``)."""
    from rlzoo.models.folder import ModelFolder

    where = recorded.get("base_model_name_or_path")
    if flag is None and not where:
        raise RlzooError(f"export: {config_file} records no base model (base_model_name_or_path); pass --base DIR")
    path = Path(flag) if flag is not None else Path(str(where))
    name = f"--base {path}" if flag is not None else f"the adapters' base model {path} ({ADAPTER_CONFIG})"
    folder = ModelFolder.read(path)
    if folder.absent is not None:
        hint = "" if flag is not None else "; pass --base DIR if the base moved"
        raise RlzooError(f"export: {name} {folder.absent}, not a Hugging Face model folder{hint}")
    if folder.config is None:
        raise RlzooError(f"export: {name}: {folder.unreadable}")
    problems = folder.problems(tokenizer="; the merged folder takes its tokenizer from the base")
    if problems:
        raise RlzooError(f"export: {name}: {'; '.join(problems)}")
    mapping = recorded.get("auto_mapping")
    trained_on = mapping.get("base_model_class") if isinstance(mapping, dict) else None
    classes = [c for c in folder.config.get("architectures") or [] if isinstance(c, str)]
    if isinstance(trained_on, str) and classes and trained_on not in classes:
        raise RlzooError(
            f"export: {name} is a {', '.join(classes)}, but the adapters were trained on a {trained_on} "
            f"({ADAPTER_CONFIG} auto_mapping); pass --base the model they were trained on"
        )
    return path, name


def lora_rule(run: RunFacts) -> list[Problem]:
    """LoRA adapters (``model.lora``) need a training engine that trains them; every target names a projection of
    the model (matched on its skeleton, built on the meta device: no weights); both engines accept the targets
    (e.g. an engine's own MoE layers may have no fused expert weights to wrap), and ``sync: adapter`` needs a
    rollout engine that loads adapters on these targets."""
    lora, config = run.config.model.lora, run.config
    if lora is None:
        return []
    engine = run.registry.get("training_engine", config.trainer.engine.name).cls
    if not engine.trains_adapters:
        usable = run.names("training_engine", lambda cls: cls.trains_adapters)
        return [
            ("trainer.engine.name", f"{engine.name!r} cannot train LoRA adapters (model.lora); use one of {usable}")
        ]
    try:
        model = skeleton(Path(config.model.path) if config.model.path else None, config.model.tiny)
    except (OSError, ValueError, ConfigError):
        return []  # an unreadable model is reported as the model's problem
    modules, parameters, unknown = split_targets(model, lora.target_modules)
    if unknown:
        return [
            (
                "model.lora.target_modules",
                f"{unknown} name no projection of this {type(model).__name__}; use "
                f"some of {target_names(model)} (module names, or expert parameters of a mixture-of-experts block)",
            )
        ]
    problems: list[Problem] = []
    training = run.training_engine
    reason = training.adapter_targets_supported(parameters) if training is not None else None
    if reason:
        problems.append(("model.lora.target_modules", reason))
    rollout = run.rollout_engine
    reason = (
        rollout.adapter_targets_supported(lora.target_modules, bool(run.model.moe)) if rollout is not None else None
    )
    if lora.sync == "adapter" and reason:
        problems.append(("model.lora.sync", f"'adapter': {reason}; use 'auto' or 'merged' (the merged weights)"))
    return problems
