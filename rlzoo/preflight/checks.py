"""Preflight: check a resolved run config against everything a run needs, before anything heavy starts.

``rlzoo config check`` and ``rlzoo train`` both call :func:`preflight` (train first thing, in
:func:`rlzoo.runtime.run.train`), so a config the check accepts does not fail while a run starts, and one it rejects
fails in a second, naming every problem at once. It reads config values, looks at files and folders, asks
whether Python packages are installed (``importlib.util.find_spec``) and consults the registry's component
classes; it never loads weights or imports an engine's library (vLLM, DeepSpeed), and builds a model only as a
skeleton on the meta device, to match ``model.lora``'s targets.

What it checks (each problem is ``(dotted.field, message saying what is allowed)``):

- components: every component the config names is constructed (no engine is started), so one whose constructor
  raises is reported as ``<field>: <kind> <name> (<distribution>) failed to set up: <message>``; then each one's
  own rules, :meth:`rlzoo.interfaces.Component.preflight`, given the :class:`~rlzoo.interfaces.RunFacts` below.
  Every rule about one engine lives in that engine (vLLM's head sizes, context length and KV cache; DeepSpeed's
  ZeRO / expert-parallel / process-count rules), every rule about one component kind on its base class (a router
  policy that replays needs an MoE model; ``algorithm.old_logprobs: rollout-only`` needs a correction and a router
  policy that read no old pass; a reward shaper's length budget; the task's own cheap checks and its default
  verifier). This module names no engine and reads no component's parameters;
- engines: the packages the chosen rollout / training engine needs are installed;
- the model: ``model.path`` is a Hugging Face folder (``config.json``, weights, a tokenizer whose ids fit the
  model's ``vocab_size``), or, without it, the cold start is enabled and ``model.tiny`` meets
  :meth:`rlzoo.config.schema.TinyModelConfig.shape_problems`;
- prompts: chat prompts (a task giving chat messages, or ``prompt.plain: chat``) need a tokenizer with a chat
  template; ``prompt.max_prompt_tokens + rollout.max_new_tokens`` fits the context (the model's, or the rollout
  engine's limit, ``RolloutEngine.context_tokens``);
- batches: ``rollout.prompts_per_step x rollout.group_size`` rows split into ``algorithm.minibatches_per_rollout``
  equal minibatches, each with a row for every process (:func:`check_data_parallel`), and a rollout engine that
  can run under a launcher (its declared capabilities);
- ``rollout.overlap: 1`` only in one process;
- a teacher (``teacher``) only with an advantage source that reads it, and a teacher that scores the policy's token
  ids: a model folder with weights, the policy's tokenizer and at least the policy's ``vocab_size``, or valid
  ``teacher.tiny`` sizes (its cold start is built on the task's character tokenizer, which the policy must use);
- evaluation settings that cannot sample (several greedy samples per prompt);
- the run folder: ``--resume`` names a folder with a checkpoint (``checkpoints/latest``; whether it or an earlier one
  is intact is verified against its digests when the run starts); otherwise ``output_dir`` holds no run;
  ``output_dir`` (and ``cold_start.output_dir`` when a cold start is built there) is a folder this user can
  write, or can be made (:func:`folder_problem`);
- GPU memory: with a device memory (``trainer.device_memory``, or ``rlzoo config check --device-memory``), the
  estimate per rank (:mod:`rlzoo.models.memory`, each engine answering for its own part) fits in it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path

from rlzoo.runtime.checkpoint.files import checkpoint_candidates, latest_checkpoint
from rlzoo.config.schema import RunConfig, iter_component_specs
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.interfaces import Component, ModelFacts, RunFacts
from rlzoo.models.memory import MOE_KEYS, REQUIRED_SIZES, MemoryEstimate, ModelShape, estimate
from rlzoo.util.units import format_bytes, parse_bytes
from rlzoo.registry import Registry
from rlzoo.preflight.resume_changes import config_changes, refusal_problems, refused

Problems = list[tuple[str, str]]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def preflight(
    config: RunConfig, registry: Registry, *, resume: Path | None = None, world: int = 1,
    model_config: Path | None = None, device_memory: int | None = None, allow_changes: Sequence[str] = (),
) -> MemoryEstimate | None:
    """Raise :class:`ConfigError` listing every problem that would stop ``rlzoo train`` with this config; return
    the run's GPU memory estimate per rank (:mod:`rlzoo.models.memory`), or ``None`` if the model's sizes are
    unknown.

    ``config`` is the resolved config (:func:`rlzoo.config.schema.load_config`); ``resume`` the ``--resume`` run folder;
    ``world`` the number of processes the run is launched with (``WORLD_SIZE``); ``allow_changes`` the fields a
    resume may change besides :data:`rlzoo.preflight.resume_changes.RESUMABLE` (``--allow-changes``). ``model_config`` (``rlzoo config
    check --model-config FILE``) is a ``config.json`` that stands in for the ``model.path`` folder, for a recipe
    whose model is not on this machine: the model's shapes are checked from it, and the folder's weights, tokenizer
    and chat template are not checked at all (``rlzoo train`` has no such option). ``device_memory`` (bytes;
    ``rlzoo config check --device-memory``) replaces ``trainer.device_memory``.
    """
    components, problems = _construct(config, registry)
    problems += _engine_problems(config, registry)
    model, model_problems = _model_problems(config, model_config)
    problems += model_problems
    run = RunFacts(config, model, world, registry, components)
    training, rollout = run.training_engine, run.rollout_engine
    if model.shape is not None and training is not None and rollout is not None:
        teacher = _teacher_shape(config)
        run.memory = estimate(config, model.shape, world, training=training, rollout=rollout, teacher=teacher)
    limit = device_memory_limit(config, device_memory)
    if limit is not None and (run.memory is not None or not model_problems):
        run.device_memory = limit[1]
        problems += _memory_problems(run, *limit)
    problems += _prompt_problems(run)
    problems += _batch_problems(config, registry, world)
    problems += _overlap_problems(config, world)
    problems += _critic_problems(run)
    problems += _lora_problems(run)
    problems += _teacher_problems(run)
    for loc, component in components.items():  # each component's own rules (Component.preflight)
        problems += component.preflight(run, loc)
    problems += _eval_problems(config)
    folder_problems = _output_dir_problems(config, resume)
    problems += folder_problems
    if not any(loc == "output_dir" for loc, _ in folder_problems):  # a folder it cannot search is not looked into
        problems += _run_folder_problems(config, resume)
    if resume is not None and Path(resume).is_dir():
        problems += refusal_problems(refused(config_changes(Path(resume), config, registry), allow_changes))
    if problems:
        raise ConfigError(problems)
    return run.memory


# -- components ------------------------------------------------------------------------------------------------


def _construct(config: RunConfig, registry: Registry) -> tuple[dict[str, Component], Problems]:
    """Every component the config names, constructed (engines too: constructing one starts nothing), so a
    component that fails at set-up is reported here, by field, before ``rlzoo train`` starts any engine."""
    components: dict[str, Component] = {}
    problems: Problems = []
    for loc, spec in iter_component_specs(config):
        try:
            components[loc] = registry.create(spec.kind, spec.name, spec.params, loc=loc)
        except ConfigError as err:
            problems += err.problems
        except RlzooError as err:
            problems.append((loc, str(err)))
    return components, problems


def missing_package(registry: Registry, kind: str, name: str) -> str | None:
    """A package component ``name`` of ``kind`` declares it needs (``Component.requires``) that is not installed."""
    for package in registry.get(kind, name).cls.requires:
        if importlib.util.find_spec(package) is None:
            return package
    return None


def _engine_problems(config: RunConfig, registry: Registry) -> Problems:
    problems = []
    for loc, kind, spec in (
        ("rollout.engine", "rollout_engine", config.rollout.engine),
        ("trainer.engine", "training_engine", config.trainer.engine),
    ):
        package = missing_package(registry, kind, spec.name)
        if package is None:
            continue
        usable = [n for n in registry.names(kind) if missing_package(registry, kind, n) is None]
        hint = registry.get(kind, spec.name).cls.install_hint
        problems.append((
            f"{loc}.name",
            f"{spec.name!r} needs the Python package {package!r}, which is not installed ({hint}); "
            f"engines usable here: {', '.join(usable) or '(none)'}",
        ))
    return problems


# -- the model -------------------------------------------------------------------------------------------------


def _model_problems(config: RunConfig, model_config: Path | None = None) -> tuple[ModelFacts, Problems]:
    if model_config is not None and config.model.path is None:
        return ModelFacts(None, None, None), [(
            "--model-config",
            "stands in for the model.path folder, but model.path is null: name the model folder the recipe trains",
        )]
    if config.model.path is None:
        tiny = config.model.tiny
        facts = ModelFacts(
            tiny.architecture == "qwen3_moe", tiny.head_dim, tiny.max_position_embeddings, False,
            ModelShape.from_tiny(tiny), tiny=True,
        )
        problems = [(f"model.tiny.{field}", message) for field, message in tiny.shape_problems()]
        if not config.cold_start.enabled:
            problems.append((
                "cold_start.enabled",
                "false while model.path is null leaves no model to train: set cold_start.enabled: true (build and "
                "fine-tune model.tiny) or model.path: <a Hugging Face model folder>",
            ))
        return facts, problems
    if model_config is not None:
        return _model_config_file(Path(model_config))
    return _model_folder(Path(config.model.path))


def _model_folder(path: Path) -> tuple[ModelFacts, Problems]:
    unknown = ModelFacts(None, None, None)
    if not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        return unknown, [("model.path", f"{path} {what}; expected a Hugging Face model folder (config.json, weights, "
                                        "tokenizer), or null to build model.tiny")]
    if not (path / "config.json").is_file():
        return unknown, [("model.path", f"{path} is not a Hugging Face model folder (no config.json)")]
    hf, facts, problems = _read_model_config(path / "config.json", "model.path")
    if hf is None:
        return facts, problems
    template = _chat_template_text(path)
    facts.chat_template = bool(template)
    facts.chat_template_tools = "tools" in template if template else None
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        problems.append(("model.path", f"{path} holds no weights (expected {' or '.join(WEIGHT_PATTERNS)})"))
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        problems.append((
            "model.path",
            f"{path} has no tokenizer ({' or '.join(TOKENIZER_FILES)}); save the model's tokenizer into the folder",
        ))
    else:
        problems += _vocab_problems(path, hf.get("vocab_size"))
    return facts, problems


def _model_config_file(file: Path) -> tuple[ModelFacts, Problems]:
    """Facts from a stand-in ``config.json`` (``--model-config``); weights and tokenizer are not looked for."""
    if not file.is_file():
        return ModelFacts(None, None, None), [("--model-config", f"{file} is not a file; name a model's config.json")]
    return _read_model_config(file, "--model-config")[1:]


def _read_model_config(file: Path, loc: str) -> tuple[dict | None, ModelFacts, Problems]:
    """A transformers ``config.json`` and the facts the preflight uses from it."""
    unknown = ModelFacts(None, None, None)
    try:
        hf = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, unknown, [(loc, f"{file} is not readable JSON: {err}")]
    if not isinstance(hf, dict):
        return None, unknown, [(loc, f"{file} is not a JSON object")]
    heads, hidden = hf.get("num_attention_heads"), hf.get("hidden_size")
    head_dim = hf.get("head_dim")
    if head_dim is None and isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        head_dim = hidden // heads  # configs without head_dim split the hidden size evenly
    facts = ModelFacts(
        moe=any(isinstance(hf.get(k), int) and hf[k] > 0 for k in MOE_KEYS),
        head_dim=head_dim,
        max_positions=hf.get("max_position_embeddings"),
        shape=ModelShape.from_hf(hf),
    )
    return hf, facts, []


def _chat_template_text(path: Path) -> str:
    """The tokenizer's chat template source ("" if none): transformers keeps it in chat_template.jinja (or .json),
    or tokenizer_config.json."""
    try:
        if (path / "chat_template.jinja").is_file():
            return (path / "chat_template.jinja").read_text()
        if (path / "chat_template.json").is_file():
            return (path / "chat_template.json").read_text()
        return str(json.loads((path / "tokenizer_config.json").read_text()).get("chat_template") or "")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return ""


def _tokenizer_vocab(file: Path) -> dict[str, int]:
    """Token -> id of a ``tokenizer.json``: its model's vocabulary and the added tokens (raises if unreadable)."""
    tok = json.loads(file.read_text())
    vocab = tok["model"]["vocab"]
    pieces = vocab.items() if isinstance(vocab, dict) else ((piece, i) for i, (piece, _) in enumerate(vocab))  # Unigram
    return {**dict(pieces), **{t["content"]: t["id"] for t in tok.get("added_tokens", [])}}


UNREADABLE_TOKENIZER = (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError)


def _vocab_problems(path: Path, vocab_size: object, loc: str = "model.path") -> Problems:
    """Every token id the tokenizer can produce must index the model's embedding (``config.json`` vocab_size)."""
    file = path / "tokenizer.json"
    if not isinstance(vocab_size, int) or not file.is_file():
        return []
    try:
        ids = list(_tokenizer_vocab(file).values())
    except UNREADABLE_TOKENIZER as err:
        return [(loc, f"{file} is not a readable tokenizer: {type(err).__name__}: {err}")]
    largest = max(ids, default=-1)
    if largest >= vocab_size:
        return [(
            loc,
            f"the tokenizer's ids reach {largest} but config.json vocab_size is {vocab_size} (ids must be "
            f"0..{vocab_size - 1}): the tokenizer does not belong to this model",
        )]
    return []


# -- LoRA -------------------------------------------------------------------------------------------------------


def _lora_problems(run: RunFacts) -> Problems:
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
        return [("trainer.engine.name", f"{engine.name!r} cannot train LoRA adapters (model.lora); use one of {usable}")]
    from rlzoo.models.lora import skeleton, split_targets, target_names

    try:
        model = skeleton(Path(config.model.path) if config.model.path else None, config.model.tiny)
    except (OSError, ValueError, ConfigError):
        return []  # an unreadable model is reported as the model's problem
    modules, parameters, unknown = split_targets(model, lora.target_modules)
    if unknown:
        return [("model.lora.target_modules", f"{unknown} name no projection of this {type(model).__name__}; use "
                 f"some of {target_names(model)} (module names, or expert parameters of a mixture-of-experts block)")]
    problems: Problems = []
    training = run.training_engine
    reason = training.adapter_targets_supported(parameters) if training is not None else None
    if reason:
        problems.append(("model.lora.target_modules", reason))
    rollout = run.rollout_engine
    reason = rollout.adapter_targets_supported(lora.target_modules, bool(run.model.moe)) if rollout is not None else None
    if lora.sync == "adapter" and reason:
        problems.append(("model.lora.sync", f"'adapter': {reason}; use 'auto' or 'merged' (the merged weights)"))
    return problems


# -- the teacher -----------------------------------------------------------------------------------------------


def _teacher_problems(run: RunFacts) -> Problems:
    """A teacher (``teacher``) is read by the advantage source (``needs_teacher``; the source's own check refuses the
    opposite) and scores the policy's token ids: a model folder with weights and the policy's tokenizer (the same
    token -> id map) whose ``vocab_size`` covers every id the policy can sample (the policy's ``vocab_size``; a larger,
    padded embedding is fine: only the sampled tokens' log-probs are read), or a tiny teacher of valid sizes,
    cold-started on the task's character tokenizer."""
    teacher = run.config.teacher
    if teacher is None:
        return []
    problems: Problems = []
    advantage = run.components.get("algorithm.advantage")
    if advantage is not None and not advantage.needs_teacher:
        usable = run.names("advantage", lambda cls: cls.needs_teacher)
        problems.append((
            "teacher",
            f"set, but advantage {advantage.name!r} (algorithm.advantage) reads no teacher, so its passes would be "
            f"wasted: use an advantage that reads one ({', '.join(usable)}), or teacher: null",
        ))
    policy, source = _policy_vocab(run)
    if teacher.tiny is not None:
        problems += [(f"teacher.tiny.{field}", message) for field, message in teacher.tiny.shape_problems()]
        task = run.components.get("task")
        mismatch = _vocab_mismatch(_char_vocab(task), policy) if task is not None else None
        if mismatch:
            problems.append((
                "teacher.tiny",
                f"a tiny teacher is cold-started on the task's character tokenizer, which differs from the policy's "
                f"({source}): {mismatch}; use teacher.model, a folder with the policy's tokenizer",
            ))
        return problems
    path, loc = Path(teacher.model), "teacher.model"
    if not (path / "config.json").is_file():
        what = "does not exist" if not path.exists() else "is not a Hugging Face model folder (no config.json)"
        return problems + [(loc, f"{path} {what}; name a model folder (config.json, weights, the policy's tokenizer), "
                                 "or use teacher.tiny")]
    hf, _, read_problems = _read_model_config(path / "config.json", loc)
    if hf is None:
        return problems + read_problems
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        problems.append((loc, f"{path} holds no weights (expected {' or '.join(WEIGHT_PATTERNS)})"))
    if not (path / "tokenizer.json").is_file():
        return problems + [(loc, f"{path} has no tokenizer.json to compare with the policy's tokenizer; save the "
                                 "teacher's tokenizer into the folder")]
    try:
        vocab = _tokenizer_vocab(path / "tokenizer.json")
    except UNREADABLE_TOKENIZER as err:
        return problems + [(loc, f"{path / 'tokenizer.json'} is not a readable tokenizer: {type(err).__name__}: {err}")]
    problems += _vocab_problems(path, hf.get("vocab_size"), loc)
    size, sampled = hf.get("vocab_size"), _policy_vocab_size(run, policy)
    if isinstance(size, int) and sampled is not None and size < sampled:
        problems.append((
            loc,
            f"{path} has vocab_size {size} but the policy's is {sampled}: the policy can sample every id up to "
            f"{sampled - 1} and the teacher scores each one; use a teacher whose vocab_size is at least {sampled}",
        ))
    mismatch = _vocab_mismatch(vocab, policy)
    if mismatch:
        problems.append((
            loc,
            f"the tokenizer of {path} differs from the policy's ({source}): {mismatch}; the teacher scores the "
            "policy's token ids, so both need one tokenizer: use a teacher built on the policy's tokenizer",
        ))
    return problems


def _char_vocab(task: Component) -> dict[str, int]:
    """The character tokenizer's vocabulary a cold start builds for ``task``."""
    from rlzoo.models.tokenizer import char_vocab

    return char_vocab(task.alphabet())


def _policy_vocab(run: RunFacts) -> tuple[dict[str, int] | None, str]:
    """The policy's token -> id map (``None`` when it cannot be read here) and where it comes from."""
    if run.config.model.path is None:
        task = run.components.get("task")
        return (_char_vocab(task) if task is not None else None), "the task's character tokenizer, model.tiny"
    file = Path(run.config.model.path) / "tokenizer.json"
    try:
        return _tokenizer_vocab(file), "model.path"
    except UNREADABLE_TOKENIZER:  # no folder here (--model-config), or a problem of model.path reported already
        return None, "model.path"


def _policy_vocab_size(run: RunFacts, policy: dict[str, int] | None) -> int | None:
    """How many token ids the policy can sample: its config.json ``vocab_size`` (``None`` if unknown), or the tiny
    model's tokenizer length."""
    if run.config.model.path is None:
        return max(policy.values()) + 1 if policy else None
    if run.model.shape is not None:
        return run.model.shape.vocab
    try:
        size = json.loads((Path(run.config.model.path) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):  # a problem of model.path, reported already
        return None
    return size if isinstance(size, int) else None


def _vocab_mismatch(teacher: dict[str, int], policy: dict[str, int] | None) -> str | None:
    """How the teacher's token -> id map differs from the policy's; ``None`` when they agree (or one is unknown)."""
    if policy is None:
        return None
    differ = [token for token in teacher.keys() | policy.keys() if teacher.get(token) != policy.get(token)]
    if not differ:
        return None

    def where(vocab: dict[str, int], token: str) -> str:
        return f"id {vocab[token]}" if token in vocab else "absent"

    example = min(differ)
    return (f"{len(differ)} tokens differ, e.g. {example!r}: {where(teacher, example)} in the teacher's, "
            f"{where(policy, example)} in the policy's")


def _teacher_shape(config: RunConfig) -> ModelShape | None:
    """The teacher's sizes for the memory estimate (``None``: no teacher, or a config.json the teacher's check
    reports)."""
    teacher = config.teacher
    if teacher is None:
        return None
    if teacher.tiny is not None:
        return ModelShape.from_tiny(teacher.tiny)
    try:
        return ModelShape.from_hf(json.loads((Path(teacher.model) / "config.json").read_text()))
    except (OSError, ValueError, AttributeError):
        return None


# -- the critic ------------------------------------------------------------------------------------------------


def _critic_problems(run: RunFacts) -> Problems:
    """A critic (``algorithm.critic``) runs on a training engine that can train values, learns the returns of an
    advantage source that reads values, and (from a folder of its own) is the policy's kind of model: dense or
    MoE as the policy (one engine configuration, e.g. DeepSpeed-MoE, serves both), over the same token ids.
    A critic never needs the policy's old-log-prob pass: it runs its own, so ``old_logprobs: rollout-only`` stays
    possible."""
    critic, config = run.config.algorithm.critic, run.config
    if critic is None:
        return []
    problems: Problems = []
    engine = run.registry.get("training_engine", config.trainer.engine.name).cls
    if not engine.trains_values:
        usable = run.names("training_engine", lambda cls: cls.trains_values)
        problems.append((
            "trainer.engine.name",
            f"{engine.name!r} cannot train a critic (algorithm.critic) (trains_values is false); use one of {usable}",
        ))
    # the constructed source: one that nests another (reverse-kl) reads what the nested one reads
    advantage = run.components.get("algorithm.advantage")
    advantage = advantage or run.registry.get("advantage", config.algorithm.advantage.name).cls
    if not advantage.needs_values:
        usable = run.names("advantage", lambda cls: cls.needs_values)
        problems.append((
            "algorithm.critic",
            f"advantage {advantage.name!r} reads no values and gives the critic no returns to learn; use an advantage "
            f"that does ({', '.join(usable)}), or critic: null",
        ))
    if critic.model is None:
        return problems
    path, loc = Path(critic.model), "algorithm.critic.model"
    if not (path / "config.json").is_file():
        what = "does not exist" if not path.exists() else "is not a Hugging Face model folder (no config.json)"
        return problems + [(loc, f"{path} {what}; name a model folder, or null for a copy of the policy")]
    hf, facts, read_problems = _read_model_config(path / "config.json", loc)
    problems += read_problems
    if hf is None:
        return problems
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        problems.append((loc, f"{path} holds no weights (expected {' or '.join(WEIGHT_PATTERNS)})"))
    if run.model.moe is not None and facts.moe != run.model.moe:
        kinds = {True: "a mixture-of-experts", False: "a dense"}
        problems.append((
            loc,
            f"{path} is {kinds[facts.moe]} model but the policy is {kinds[run.model.moe]} one: the critic trains on "
            "the policy's engine configuration; use a critic of the policy's kind, or null for a copy of the policy",
        ))
    policy_vocab = run.model.shape.vocab if run.model.shape is not None and not run.model.tiny else None  # tiny: a bound
    if policy_vocab is not None and hf.get("vocab_size") != policy_vocab:
        problems.append((
            loc,
            f"{path} has vocab_size {hf.get('vocab_size')} but the policy {policy_vocab}: the critic reads the "
            "policy's token ids; use a critic built on the policy's tokenizer",
        ))
    return problems


# -- prompts ---------------------------------------------------------------------------------------------------


def _prompt_problems(run: RunFacts) -> Problems:
    """Chat prompts need a tokenizer with a chat template; prompt plus response must fit the context."""
    config, model = run.config, run.model
    p, problems = config.prompt, []
    task = run.components.get("task")
    chat_task = task is not None and task.chat_prompts()  # a task that failed to construct is reported already
    if (chat_task or p.plain == "chat") and model.chat_template is False:
        why = f"task {config.task.name!r} gives chat messages" if chat_task else "prompt.plain is 'chat'"
        if config.model.path is None:
            problems.append(("model.path", f"{why}, which need a tokenizer with a chat template, and the cold "
                             "start's character tokenizer has none: set model.path to a model folder whose tokenizer "
                             "has one, and cold_start.enabled: false"))
        else:
            problems.append(("model.path", f"{why}, which need a tokenizer with a chat template, and "
                             f"{config.model.path} has none (no chat_template.jinja, nor chat_template in "
                             "tokenizer_config.json): use an instruct/chat model's folder"
                             + ("" if chat_task else ", or prompt.plain: text")))
    limit = run.rollout_engine.context_tokens() if run.rollout_engine is not None else None
    context = limit if limit is not None else model.max_positions
    if context is not None and config.rollout.max_new_tokens >= context:
        problems.append((
            "rollout.max_new_tokens",
            f"{config.rollout.max_new_tokens} leaves no room for the prompt in the {context}-token context (the "
            "model's max_position_embeddings or the rollout engine's limit); use less than "
            f"{context}",
        ))
    problems += _episode_problems(run, chat_task or p.plain == "chat", context)
    needed = None if p.max_prompt_tokens is None else p.max_prompt_tokens + config.rollout.max_new_tokens
    if needed is not None and context is not None and needed > context:
        problems.append((
            "prompt.max_prompt_tokens",
            f"{p.max_prompt_tokens} + rollout.max_new_tokens {config.rollout.max_new_tokens} exceeds the "
            f"{context}-token context (the model's max_position_embeddings or the rollout engine's limit): use at "
            f"most {max(context - config.rollout.max_new_tokens, 0)}",
        ))
    return problems


def _episode_problems(run: RunFacts, chat: bool, context: int | None) -> Problems:
    """An episode's token budget fits the context; tools in chat prompts need a template that renders them."""
    episode, problems = run.config.episode, []
    if episode.max_tokens is not None and context is not None and episode.max_tokens > context:
        problems.append((
            "episode.max_tokens",
            f"{episode.max_tokens} exceeds the {context}-token context (the model's max_position_embeddings or the "
            f"rollout engine's limit); use at most {context}",
        ))
    prompt_limit = run.config.prompt.max_prompt_tokens
    if episode.max_tokens is not None and prompt_limit is not None and prompt_limit >= episode.max_tokens:
        problems.append((
            "episode.max_tokens",
            f"{episode.max_tokens} leaves no room for a response after a prompt of up to prompt.max_prompt_tokens "
            f"{prompt_limit} tokens; use more than {prompt_limit}",
        ))
    if episode.tools and chat and run.model.chat_template_tools is False:
        problems.append((
            "episode.tools",
            f"the chat template of {run.config.model.path} never reads `tools`, so the model would not see the tools' "
            "descriptions: use a model whose template supports tools (Qwen2.5/Qwen3, Hermes), or plain-text prompts "
            "(prompt.plain: text) whose cold start demonstrates the calls",
        ))
    return problems


# -- batches and processes -------------------------------------------------------------------------------------


def data_parallel_problem(config: RunConfig, world: int, prompts: int | None = None) -> str | None:
    """Every rank needs at least one row of every minibatch; ``prompts`` defaults to rollout.prompts_per_step."""
    if world <= 1:
        return None
    prompts = config.rollout.prompts_per_step if prompts is None else prompts
    rows = prompts * config.rollout.group_size
    minibatches = config.algorithm.minibatches_per_rollout
    if rows // minibatches >= world:
        return None
    return (
        f"{world} processes need at least {world} rows in every minibatch, but a step's {rows} rows "
        f"(rollout.prompts_per_step x rollout.group_size) in {minibatches} minibatches "
        f"(algorithm.minibatches_per_rollout) leave {rows // minibatches}: raise the batch, lower "
        f"minibatches_per_rollout, or run fewer processes"
    )


def check_data_parallel(config: RunConfig, world: int, prompts: int | None = None) -> None:
    """:func:`data_parallel_problem` as an :class:`RlzooError` (the run checks again once the task's size is known)."""
    problem = data_parallel_problem(config, world, prompts)
    if problem is not None:
        raise RlzooError(problem)


def _batch_problems(config: RunConfig, registry: Registry, world: int) -> Problems:
    rows = config.rollout.prompts_per_step * config.rollout.group_size
    minibatches = config.algorithm.minibatches_per_rollout
    problems = []
    if rows % minibatches:
        divisors = [d for d in range(1, rows + 1) if rows % d == 0]
        problems.append((
            "algorithm.minibatches_per_rollout",
            f"{minibatches} does not divide a step's {rows} rows (rollout.prompts_per_step "
            f"{config.rollout.prompts_per_step} x rollout.group_size {config.rollout.group_size}) into equal "
            f"minibatches; use one of {divisors}",
        ))
    problem = data_parallel_problem(config, world)
    if problem is not None:
        problems.append(("algorithm.minibatches_per_rollout", problem))
    rollout = registry.get("rollout_engine", config.rollout.engine.name).cls
    per_rank = config.rollout.per_rank and rollout.runs_per_rank
    if world > 1 and not rollout.runs_under_launcher and not per_rank:
        usable = [i.name for i in registry.components("rollout_engine") if i.cls.runs_under_launcher]
        hint = " or rollout.per_rank: true" if rollout.runs_per_rank else ""
        problems.append((
            "rollout.engine.name",
            f"{rollout.name!r} cannot run inside rank 0 alone of a multi-process run (building it is collective "
            f"over the run's process group); use {' or '.join('{name: %s}' % name for name in usable)}{hint} for "
            "multi-process runs",
        ))
    return problems


def _overlap_problems(config: RunConfig, world: int) -> Problems:
    """What :mod:`rlzoo.rl.overlap` cannot honour: several processes (a training engine that cannot exchange its
    weights says so in its own check)."""
    if config.rollout.overlap == 0 or world <= 1:
        return []
    return [(
        "rollout.overlap",
        f"1 runs in one process only; this run has {world} (rank 0 would sample the next batch while the "
        "ranks meet at the update's collectives): use rollout.overlap: 0 with several processes",
    )]


# -- evaluation ------------------------------------------------------------------------------------------------


def _eval_problems(config: RunConfig) -> Problems:
    t = config.train
    if t.eval_samples_per_prompt > 1 and t.eval_temperature == 0:
        return [(
            "train.eval_samples_per_prompt",
            f"{t.eval_samples_per_prompt} responses per prompt at eval_temperature 0 (greedy) are copies of one "
            "response, and vLLM refuses them: use 1, or set train.eval_temperature > 0",
        )]
    return []


# -- the run folder --------------------------------------------------------------------------------------------


def _run_folder_problems(config: RunConfig, resume: Path | None) -> Problems:
    if resume is not None:
        resume = Path(resume)
        if not resume.is_dir():
            return [(
                "--resume",
                f"{resume} is not a folder, so it holds no complete checkpoint; name the run folder of an earlier run "
                "(its output_dir)",
            )]
        if not checkpoint_candidates(resume):  # which one is intact is verified when the run starts (digests)
            return [(
                "--resume",
                f"no complete checkpoint found in {resume / 'checkpoints'}; start a new run without --resume",
            )]
        return []
    run_dir = Path(config.output_dir)
    if latest_checkpoint(run_dir) is not None:
        return [(
            "output_dir",
            f"{run_dir} already holds a run; resume it with --resume {run_dir} or choose another output_dir",
        )]
    return []


def _exists(path: Path) -> bool | None:
    """Whether ``path`` exists; ``None`` when a folder on the way cannot be searched (no x permission)."""
    try:
        return path.exists()
    except OSError:
        return None


def folder_problem(folder: Path, field: str) -> str | None:
    """Why a run cannot write into ``folder`` (made if missing), or ``None``: it is a file, or a folder this user
    cannot write to, or it is missing and cannot be made (an ancestor is a file, or the nearest existing one is not
    writable). Permissions by :func:`os.access`, so root passes them (a read-only file system still fails)."""
    folder = Path(folder)
    if _exists(folder):
        if not folder.is_dir():
            return f"{folder} is a file, not a folder: choose another {field}, or move the file away"
        if not os.access(folder, os.W_OK | os.X_OK):
            return (f"{folder} is a folder this user cannot write to: make it writable (chmod u+rwx {folder}) or "
                    f"choose another {field}")
        return None
    ancestor = folder.absolute().parent
    while not _exists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{folder} cannot be made: {ancestor} is a file, not a folder; choose another {field}"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return (f"{folder} cannot be made: its parent folder {ancestor} is not writable by this user; choose another "
                f"{field}, or make the folder yourself with write permission")
    return None


def _output_dir_problems(config: RunConfig, resume: Path | None) -> Problems:
    """``output_dir`` (a new run's folder; with ``--resume`` the run folder named there is used instead) can be
    written, and so can ``cold_start.output_dir`` when the cold start builds a model there."""
    problems = []
    if resume is None and (problem := folder_problem(Path(config.output_dir), "output_dir")):
        problems.append(("output_dir", problem))
    cold = config.cold_start
    if config.model.path is None and cold.enabled and cold.output_dir:
        folder = Path(cold.output_dir)
        reused = bool(_exists(folder / "cold_start.json"))
        if not reused and (problem := folder_problem(folder, "cold_start.output_dir")):
            problems.append(("cold_start.output_dir", problem))
    return problems


# -- GPU memory ------------------------------------------------------------------------------------------------


def device_memory_limit(config: RunConfig, override: int | None = None) -> tuple[str, int] | None:
    """``(where it was set, bytes)`` of one GPU's memory: ``override`` (``--device-memory``), else
    ``trainer.device_memory`` (validated by the config); ``None``: no limit to check."""
    if override is not None:
        return "--device-memory", override
    if config.trainer.device_memory is not None:
        return "trainer.device_memory", parse_bytes(config.trainer.device_memory)
    return None


def _memory_problems(run: RunFacts, loc: str, limit: int) -> Problems:
    """The estimate per rank must fit in ``limit``; the message names what lowers its largest parts."""
    memory = run.memory
    if memory is None:
        return [(loc, f"the model's config.json lacks the sizes the memory estimate needs ({', '.join(REQUIRED_SIZES)}"
                      "); set trainer.device_memory: null to skip the check")]
    if memory.fits(limit):
        return []
    parts, total = memory.bytes_on(limit), memory.total(limit)
    groups: dict[str, list[str]] = {}  # the parts one change shrinks
    for name, hint in _memory_hints(run).items():
        if parts.get(name, 0) >= total / 100:  # the parts that matter
            groups.setdefault(hint, []).append(name)
    ranked = sorted(groups.items(), key=lambda group: -sum(parts[name] for name in group[1]))
    hints = [f"{' + '.join(names)} ({format_bytes(sum(parts[n] for n in names))}): {hint}" for hint, names in ranked]
    return [(loc, "\n".join([
        f"{format_bytes(limit)} per GPU is less than the run's estimated {format_bytes(total)} per "
        "rank (rlzoo.models.memory); to fit:",
        *(f"    - {hint}" for hint in hints),
        "    estimate per rank:",
        *(f"      {line}" for line in memory.lines(limit)),
    ]))]


def _memory_hints(run: RunFacts) -> dict[str, str]:
    """For each part of the estimate that the config can shrink: the fields to change (the engines' parts: what
    each engine says shrinks them)."""
    t, config = run.config.trainer, run.config
    checkpointing = "" if t.activation_checkpointing else ", or set trainer.activation_checkpointing: true"
    hints = {
        "activations": f"lower trainer.max_tokens_per_micro_batch (now {t.max_tokens_per_micro_batch}){checkpointing}",
        "logits": f"lower trainer.logits_chunk_tokens (now {t.logits_chunk_tokens})",
        "reference": f"algorithm.kl_coef: 0 drops the KL reference model (now {config.algorithm.kl_coef})",
        "teacher": "a smaller teacher (teacher.model or teacher.tiny)",
        "rollout": run.rollout_engine.memory_hint(run),
    }
    state = run.training_engine.memory_hint(run)
    hints.update(dict.fromkeys(("optimizer", "gradients", "weights", "master_copy"), state))
    return hints
