"""The policy's model as the preflight knows it: its facts and what makes it unusable, from ``model.path``'s folder,
a ``--model-config`` stand-in, or ``model.tiny``.

``model.path`` is a Hugging Face folder (``config.json``, weights, a tokenizer whose ids fit the model's
``vocab_size``: :class:`rlzoo.models.folder.ModelFolder`), or, without it, the cold start is enabled and
``model.tiny`` meets :meth:`rlzoo.config.schema.TinyModelConfig.shape_problems`. The problems travel in
:attr:`ModelFacts.problems <rlzoo.models.folder.ModelFacts>`; :func:`model_rule` reports them.
"""

from __future__ import annotations

from pathlib import Path

from rlzoo.config.schema import RunConfig
from rlzoo.interfaces import ModelFacts, Problem, RunFacts
from rlzoo.models.folder import NO_CONFIG, NOT_A_MODEL_FOLDER, ModelFolder, config_facts, read_config
from rlzoo.models.folder_tensors import hf_config
from rlzoo.models.memory import ModelShape


def policy_facts(config: RunConfig, model_config: Path | None = None) -> ModelFacts:
    """What the preflight knows about the policy (``model_config``: ``rlzoo config check --model-config``, a
    ``config.json`` standing in for the ``model.path`` folder)."""
    if model_config is not None and config.model.path is None:
        return _unknown(
            [
                (
                    "--model-config",
                    "stands in for the model.path folder, but model.path is null: name the model folder the recipe trains",
                )
            ]
        )
    if config.model.path is None:
        tiny = config.model.tiny
        facts = ModelFacts(
            tiny.moe,
            tiny.head_dim,
            tiny.max_position_embeddings,
            False,
            ModelShape.from_tiny(tiny),
            tiny=True,
        )
        facts.problems = [(f"model.tiny.{field}", message) for field, message in tiny.shape_problems()]
        if not config.cold_start.enabled:
            facts.problems.append(
                (
                    "cold_start.enabled",
                    "false while model.path is null leaves no model to train: set cold_start.enabled: true (build and "
                    "fine-tune model.tiny) or model.path: <a Hugging Face model folder>",
                )
            )
        return facts
    if model_config is not None:
        return _config_file(Path(model_config))
    return _folder(Path(config.model.path))


def model_rule(run: RunFacts) -> list[Problem]:
    """What makes the policy's model unusable (found while reading its facts)."""
    return run.model.problems


def _unknown(problems: list[Problem]) -> ModelFacts:
    return ModelFacts(None, None, None, problems=problems)


def _folder(path: Path) -> ModelFacts:
    folder = ModelFolder.read(path)
    if folder.absent == NO_CONFIG:
        return _unknown([("model.path", f"{path} {NOT_A_MODEL_FOLDER}")])
    if folder.absent is not None:
        return _unknown(
            [
                (
                    "model.path",
                    f"{path} {folder.absent}; expected a Hugging Face model folder (config.json, "
                    "weights, tokenizer), or null to build model.tiny",
                )
            ]
        )
    if folder.config is None:
        return _unknown([("model.path", str(folder.unreadable))])
    facts = folder.facts()
    facts.problems = [
        ("model.path", message)
        for message in folder.problems(
            tokenizer="; save the model's tokenizer into the folder",
            ids=True,
        )
    ]
    return facts


def _config_file(file: Path) -> ModelFacts:
    """Facts from a stand-in ``config.json`` (``--model-config``), and whether transformers builds it as a causal LM;
    weights and tokenizer are not looked for."""
    if not file.is_file():
        return _unknown([("--model-config", f"{file} is not a file; name a model's config.json")])
    hf, unreadable = read_config(file)
    if hf is None:
        return _unknown([("--model-config", str(unreadable))])
    facts = config_facts(hf)
    if (problem := hf_config(hf)[1]) is not None:  # the architecture; no weights to compare with
        facts.problems = [("--model-config", f"{file}: {problem}")]
    return facts
