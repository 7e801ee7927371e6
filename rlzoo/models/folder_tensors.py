"""A model folder's ``config.json`` against its weights, no tensor loaded: what transformers would build, and whether
the weights fill it.

The model a role builds (:data:`HEADS`: the policy and a teacher a causal LM, a critic a one-output token
classifier, a reward model a sequence classifier) is built from ``config.json`` on the meta device (modules and
shapes, no memory), and its weights are named as ``save_pretrained`` writes them
(:func:`rlzoo.models.export.checkpoint_weights`: tied weights once, MoE experts per expert). The folder's tensors are
read from the safetensors headers (``model.safetensors``, or the shards ``model.safetensors.index.json`` names;
:func:`rlzoo.util.safetensors_header.read_header`). Then

- a tensor the model has and the weights lack is *missing* (transformers would initialise it at random and train
  on: a config of 3 layers over the weights of 2);
- a tensor the weights hold and the model has no place for is *unexpected* (transformers would drop it: the config
  describes a smaller model), unless it is a non-persistent buffer, a tied copy, or one the model class itself
  ignores (``_keys_to_ignore_on_load_unexpected``);
- a tensor of another shape than the model's is *mis-shaped* (transformers would fail with a ``RuntimeError``
  while loading: a wrong ``moe_intermediate_size``).

A config that transformers cannot build as the role's model (a T5 encoder-decoder given as a policy) is refused
before, by :func:`build_problem`. Not checked: ``pytorch_model*.bin`` folders (a pickle is not opened before the
model loads) and quantized weights (``quantization_config``: packed tensors of other shapes).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Literal

import torch

from rlzoo.util.safetensors_header import HeaderProblem, TensorInfo, read_header

log = logging.getLogger(__name__)
Head = Literal["lm", "value", "score"]

#: what each role builds a folder into: (transformers Auto class, what it is, labels forced on it, names the role
#: initialises itself (a critic's new value head), names it drops on purpose (the causal LM's head under a critic))
HEADS: dict[str, tuple[str, str, int | None, tuple[str, ...], tuple[str, ...]]] = {
    "lm": ("AutoModelForCausalLM", "a causal LM", None, (), ()),
    "value": ("AutoModelForTokenClassification", "a critic (a token classifier with one output)", 1, ("score.",),
              ("lm_head.",)),
    "score": ("AutoModelForSequenceClassification", "a reward model (a sequence classifier)", None, (), ()),
}
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
SHOWN = 3  # tensors named in a message; the rest are counted
DIFFERENT = ("config.json and the weights describe different models; restore the config.json saved with these weights, "
             "or use a folder saved whole (save_pretrained)")


def hf_config(config: dict[str, Any], head: Head = "lm") -> tuple[Any, str | None]:
    """transformers' config object for a ``config.json`` dict, or ``None`` and why transformers cannot build the
    role's model (``head``) from it, naming the ``config.json`` field and the architecture."""
    import transformers
    from transformers import CONFIG_MAPPING

    auto, what, labels, _, _ = HEADS[head]
    model_type, names = config.get("model_type"), _architectures(config)
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        said = f"model_type {model_type!r}" if model_type is not None else "no model_type"
        return None, (f"config.json has {said}{names}, an architecture transformers {transformers.__version__} "
                      f"does not know: rlzoo trains {what} that transformers builds ({auto})")
    try:
        built = CONFIG_MAPPING[model_type].from_dict({k: v for k, v in config.items() if k != "model_type"})
    except Exception as err:  # noqa: BLE001 - a config transformers refuses, whatever its reason, is reported
        return None, f"config.json is not a valid {model_type} config for transformers: {_one_line(err)}"
    if labels is not None:
        built.num_labels = labels
    if type(built) not in _auto_class(head)._model_mapping:
        return None, (f"config.json model_type {model_type!r}{names} is not {what} transformers can build "
                      f"({auto} has no {model_type} model): rlzoo trains decoder-only models; use a causal LM "
                      "(e.g. Qwen, Llama, SmolLM)")
    return built, None


def tensor_problems(path: Path, config: dict[str, Any], head: Head = "lm") -> list[str]:
    """What is wrong between ``path``'s weights and the model its ``config.json`` (``config``) describes for the
    role ``head``: an architecture transformers cannot build as that model, then missing, unexpected and mis-shaped
    tensors, each named (the first :data:`SHOWN`, the rest counted). Call after the headers were found whole."""
    built, problem = hf_config(config, head)
    if built is None:
        return [f"{path}: {problem}"]
    held = folder_tensors(path)
    if held is None or config.get("quantization_config") is not None:
        return []
    model, why = build_problem(built, head)
    if model is None:
        return [f"{path}: {why}"]
    try:
        return compare(path, held, model, head)
    except Exception:  # noqa: BLE001 - transformers could not name this model's weights: the load will tell
        log.warning("the weights of %s were not compared with its config.json: transformers %s could not name "
                    "the weights of %s", path, _version(), type(model).__name__, exc_info=True)
        return []


def folder_tensors(path: Path) -> dict[str, TensorInfo] | None:
    """The tensors transformers loads from ``path`` by name, from the safetensors headers: ``model.safetensors``,
    or every shard ``model.safetensors.index.json`` names; ``None`` when there are none to read (``.bin`` weights,
    other names) or a file or the index is damaged (reported by the folder's weight check)."""
    index, single = path / SAFE_INDEX, path / SAFE_WEIGHTS
    try:
        if index.is_file():
            files = sorted({str(shard) for shard in json.loads(index.read_text())["weight_map"].values()})
        elif single.is_file():
            files = [SAFE_WEIGHTS]
        else:
            return None
        tensors: dict[str, TensorInfo] = {}
        for name in files:
            tensors.update(read_header(path / name))
        return tensors
    except (OSError, HeaderProblem, ValueError, KeyError, TypeError, AttributeError):
        return None


def build_problem(config: Any, head: Head) -> tuple[torch.nn.Module | None, str | None]:
    """The role's model built from ``config`` on the meta device (no memory), or ``None`` and why transformers
    could not build it (a config whose sizes contradict each other)."""
    try:
        with torch.device("meta"):
            return _auto_class(head).from_config(config), None
    except Exception as err:  # noqa: BLE001 - whatever transformers raises, the run would raise it too
        return None, f"transformers cannot build the model config.json describes: {_one_line(err)}"


def expected_tensors(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """The model's weights as ``save_pretrained`` would name them, with their shapes."""
    from rlzoo.models.export import checkpoint_weights

    return {name: tuple(tensor.shape) for name, tensor in checkpoint_weights(model)}


def compare(path: Path, held: dict[str, TensorInfo], model: torch.nn.Module, head: Head) -> list[str]:
    """Missing, unexpected and mis-shaped tensors of ``held`` (the folder's) against ``model``, one message each."""
    _, what, _, fresh, dropped = HEADS[head]
    expected = expected_tensors(model)
    memory = {name: tuple(t.shape) for name, t in model.state_dict().items()}  # tied and in-memory names too
    ignored_missing = list(type(model)._keys_to_ignore_on_load_missing or [])  # transformers' own, None by default
    ignored_unexpected = list(type(model)._keys_to_ignore_on_load_unexpected or [])
    buffers = {name for name, _ in model.named_buffers()} - set(memory)  # non-persistent: never saved
    missing = [name for name in expected if name not in held and not name.startswith(fresh)
               and not _matches(name, ignored_missing)]
    unexpected = [name for name in held if name not in expected and name not in memory and name not in buffers
                  and not name.startswith(dropped) and not _matches(name, ignored_unexpected)]
    shaped = [(name, held[name].shape, shape) for name, shape in [*expected.items(), *memory.items()]
              if name in held and held[name].shape != shape]
    shaped = list(dict.fromkeys(shaped))
    problems, model_name = [], type(model).__name__
    if missing:
        problems.append(
            f"{path}: config.json describes {_count(missing)} the weights lack: {_names(missing)}; transformers would "
            f"initialise them at random in {model_name}: {DIFFERENT}"
        )
    if unexpected:
        problems.append(
            f"{path}: the weights hold {_count(unexpected)} config.json does not describe: {_names(unexpected)}; "
            f"{model_name} has no place for them and transformers would drop them: {DIFFERENT}"
        )
    if shaped:
        shown = ", ".join(f"{name} is {list(have)} in the weights and {list(want)} by config.json"
                          for name, have, want in shaped[:SHOWN])
        more = f" (and {len(shaped) - SHOWN} more)" if len(shaped) > SHOWN else ""
        problems.append(
            f"{path}: {_count(shaped)} of another shape in the weights than config.json gives {what}: {shown}{more}; "
            f"the weights cannot be loaded into this model: {DIFFERENT}"
        )
    return problems


def _auto_class(head: Head) -> Any:
    """The transformers Auto class the role builds (:data:`HEADS`)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

    classes = (AutoModelForCausalLM, AutoModelForTokenClassification, AutoModelForSequenceClassification)
    return {cls.__name__: cls for cls in classes}[HEADS[head][0]]


def _version() -> str:
    import transformers

    return transformers.__version__


def _one_line(err: Exception) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def _architectures(config: dict[str, Any]) -> str:
    names = config.get("architectures")
    if isinstance(names, list) and names:
        return f" (architectures {', '.join(map(str, names))})"
    return ""




def _matches(name: str, patterns: list[str]) -> bool:
    return any(re.search(pattern, name) for pattern in patterns)


def _count(items: list) -> str:
    return f"{len(items)} tensor{'s' if len(items) != 1 else ''}"


def _names(names: list[str]) -> str:
    more = f" (and {len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
