"""Run configuration: pydantic models, YAML loading, ``--set a.b=c`` overrides, presets, component resolution.

A component is written ``{name: <registered name>, <its parameters>...}``. Validation is two-phase: the run's
own structure is checked by pydantic, then each component spec is looked up in the plugin registry and its
parameters validated against that component's ``Params`` model (unknown keys are errors). All problems of a
config are reported together, each with its dotted location.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from rlzoo.errors import ConfigError, RegistryError, UnknownComponentError
from rlzoo.util.units import parse_bytes
from rlzoo.config.presets import DEFAULT_COMPONENTS, PRESETS, expand_preset
from rlzoo.registry import Registry, default_registry, format_validation_error


FLOAT32_MAX = 3.4028234663852886e38


def _fits_float32(value: float) -> float:
    if value > FLOAT32_MAX:  # torch's optimizers pass it to float32 kernels, which raise mid-step
        raise ValueError(f"{value:g} does not fit in float32, the optimizer's number type: at most {FLOAT32_MAX:.4g}")
    return value


LearningRate = Annotated[float, Field(gt=0), AfterValidator(_fits_float32)]
"""An optimizer's learning rate: positive, and a float32 number."""
Beta = Annotated[float, Field(ge=0, lt=1)]
"""One of Adam's moment decays, in [0, 1)."""


class Section(BaseModel):
    """A section of the run config. Every number must be finite (``inf``, ``-inf`` and ``nan`` are refused, also
    as text through ``--set``): no setting means "unbounded" by an infinity (those use ``null``), and a non-finite
    learning rate, coefficient or clip range would only turn the weights into NaN."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ComponentSpec(BaseModel):
    """``name`` selects a registered component of this spec's kind; every other key is one of its parameters
    (validated by the component's ``Params``, which refuse non-finite numbers as the sections do)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    kind: ClassVar[str] = ""
    name: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _spec(kind_name: str) -> type[ComponentSpec]:
    return type(f"{kind_name.title().replace('_', '')}Spec", (ComponentSpec,), {"kind": kind_name})


RatioSpec = _spec("ratio")
AdvantageSpec = _spec("advantage")
ClipperSpec = _spec("clipper")
AggregationSpec = _spec("aggregation")
KLSpec = _spec("kl")
CorrectionSpec = _spec("correction")
BatchFilterSpec = _spec("batch_filter")
RewardShaperSpec = _spec("reward_shaper")
RegulariserSpec = _spec("regulariser")
KLControllerSpec = _spec("kl_controller")
ValueLossSpec = _spec("value_loss")
RouterSpec = _spec("router")
VerifierSpec = _spec("verifier")
TaskSpec = _spec("task")
RolloutEngineSpec = _spec("rollout_engine")
TrainingEngineSpec = _spec("training_engine")
EnvironmentSpec = _spec("environment")
ToolSpec = _spec("tool")
ToolParserSpec = _spec("tool_parser")
LoggerSpec = _spec("logger")

# the engines a config that names none runs on: in-process, installed with rlzoo itself (the cold start evaluates
# with the rollout one)
DEFAULT_ROLLOUT_ENGINE = "hf"
DEFAULT_TRAINING_ENGINE = "torch"
# episodes: one turn unless an environment says otherwise; tool calls in the Hermes / Qwen format
DEFAULT_ENVIRONMENT = "single-turn"
DEFAULT_TOOL_PARSER = "hermes"
# the critic's loss as verl's compute_value_loss, and its default loss_agg_mode
DEFAULT_VALUE_LOSS = "clipped"
DEFAULT_CRITIC_AGGREGATION = "token-mean"


def _default(spec: type[ComponentSpec], key: str) -> Any:
    """The default component of an algorithm field: defined once, in ``rlzoo.config.presets.DEFAULT_COMPONENTS``."""
    return lambda: spec(**DEFAULT_COMPONENTS[key])


class CriticConfig(Section):
    """A value model trained beside the policy (PPO's critic; :mod:`rlzoo.rl.critic`, docs/critic.md). It runs on the
    run's training engine (``trainer.engine``, with the trainer's micro-batch, dtype and packing settings) with
    its own weights and optimizer, and is saved and resumed with the run."""

    model: str | None = Field(
        None,
        description="null: a copy of the policy's initial weights with a fresh scalar value head; or a folder (a "
        "Hugging Face model, e.g. a critic saved by an earlier run, whose MoE-or-dense kind matches the policy's)",
    )
    lr: LearningRate = Field(1e-4, description="the critic's AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    grad_clip: float | None = Field(1.0, gt=0)
    value_loss: ValueLossSpec = Field(
        default_factory=lambda: ValueLossSpec(name=DEFAULT_VALUE_LOSS),
        description="the regression loss onto the advantage source's returns (clipped: verl's compute_value_loss)",
    )
    aggregation: AggregationSpec = Field(
        default_factory=lambda: AggregationSpec(name=DEFAULT_CRITIC_AGGREGATION),
        description="how the per-token value loss is reduced (verl's critic loss_agg_mode)",
    )
    warmup_steps: int = Field(
        0, ge=0, description="steps at the start that train only the critic, the policy unchanged (verl's critic_warmup)"
    )


class AlgorithmConfig(Section):
    """One policy-gradient algorithm = ratio x advantage x clipper x aggregation (x KL) (x router policy)."""

    preset: str | None = None
    ratio: RatioSpec = Field(default_factory=_default(RatioSpec, "ratio"))
    advantage: AdvantageSpec = Field(default_factory=_default(AdvantageSpec, "advantage"))
    clipper: ClipperSpec = Field(default_factory=_default(ClipperSpec, "clipper"))
    aggregation: AggregationSpec = Field(default_factory=_default(AggregationSpec, "aggregation"))
    kl: KLSpec = Field(default_factory=_default(KLSpec, "kl"))
    kl_coef: float = Field(0.0, ge=0.0, description="coefficient of the KL-to-reference loss term; 0 disables it")
    kl_in_reward: KLControllerSpec | None = Field(
        None,
        description="the reference KL (estimator `kl`, on the old log-probs) as a per-token reward penalty, its "
        "coefficient from this controller (fixed, adaptive); null: none",
    )
    critic: CriticConfig | None = Field(
        None, description="a learned value model (needed by advantages that read values, e.g. gae); null: none"
    )
    correction: CorrectionSpec = Field(
        default_factory=_default(CorrectionSpec, "correction"),
        description="train-inference mismatch correction (e.g. truncated importance sampling)",
    )
    router: RouterSpec | None = Field(None, description="MoE router policy (routing replay); null = none")
    batch_filter: BatchFilterSpec = Field(
        default_factory=_default(BatchFilterSpec, "batch_filter"),
        description="which scored prompt groups a step trains on (dynamic-sampling: only informative ones)",
    )
    reward_shaping: list[RewardShaperSpec] = Field(
        default_factory=list, description="terms added to the verifier's rewards, in order, before advantages"
    )
    regularisers: list[RegulariserSpec] = Field(
        default_factory=list, description="extra loss terms (e.g. {name: entropy, coef: 0.001})"
    )
    minibatches_per_rollout: int = Field(4, ge=1, description="gradient steps per rollout batch")
    log_ratio_clamp: float = Field(20.0, gt=0, description="log-ratios are clamped to +-this before exp")
    old_logprobs: Literal["train", "rollout", "rollout-only"] = Field(
        "train",
        description="train: recompute old log-probs with the training engine; rollout: use the rollout engine's "
        "(the training engine's pass still runs, for the mismatch metrics and corrections); rollout-only: use the "
        "rollout engine's and skip that pass (no mismatch/* or policy/entropy metrics; only with a correction that "
        "does not read it and a router policy that does not replay the old pass)",
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            import difflib

            close = difflib.get_close_matches(value, list(PRESETS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown preset {value!r}{hint} Valid presets: {', '.join(PRESETS)}")
        return value


class TinyModelConfig(Section):
    """A model built locally from a transformers config (random init); the rollout engine may restrict its sizes
    further (vLLM: its head sizes, checked by that engine)."""

    architecture: Literal["qwen3_moe", "qwen3"] = "qwen3_moe"
    hidden_size: int = Field(64, ge=1)
    num_hidden_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(2, ge=1)
    num_key_value_heads: int = Field(1, ge=1)
    head_dim: int = Field(32, ge=2, description="rotary embeddings rotate pairs: even (vLLM: 32, 64, 80, 96, ...)")
    intermediate_size: int = Field(128, ge=1)
    moe_intermediate_size: int = Field(64, ge=1)
    num_experts: int = Field(8, ge=1)
    num_experts_per_tok: int = Field(2, ge=1)
    max_position_embeddings: int = Field(256, ge=1)
    rope_theta: float = Field(10000.0, gt=0)

    def shape_problems(self) -> list[tuple[str, str]]:
        """The shape rules a model built from these sizes must meet, as ``(field, message)`` pairs.

        transformers repeats each key/value head over ``heads / kv_heads`` query heads (grouped-query attention),
        rotates ``head_dim`` in pairs (RoPE), and picks ``num_experts_per_tok`` of ``num_experts``. An engine's
        own limits (vLLM's head sizes) are that engine's check (``Component.preflight``).
        """
        problems = []
        if self.num_attention_heads % self.num_key_value_heads:
            divisors = [d for d in range(1, self.num_attention_heads + 1) if self.num_attention_heads % d == 0]
            problems.append((
                "num_key_value_heads",
                f"{self.num_key_value_heads} does not divide num_attention_heads={self.num_attention_heads}; "
                f"use one of {divisors}",
            ))
        if self.head_dim % 2:
            problems.append(("head_dim", f"{self.head_dim} is odd; rotary embeddings need an even head_dim"))
        if self.architecture == "qwen3_moe" and self.num_experts_per_tok > self.num_experts:
            problems.append((
                "num_experts_per_tok",
                f"{self.num_experts_per_tok} exceeds num_experts={self.num_experts}; use 1..{self.num_experts}",
            ))
        return problems


#: what model.lora targets unless told: every attention projection (dense and MoE models alike)
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class LoraConfig(Section):
    """LoRA adapters on the policy (:mod:`rlzoo.models.lora`, through peft): only the adapters train, the KL
    reference is the same model with its adapters disabled, checkpoints hold the adapters (docs/lora.md)."""

    rank: int = Field(8, gt=0, description="the adapters' rank r")
    alpha: float = Field(16.0, gt=0, description="the scale is alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input")
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        min_length=1,
        description="module names (q_proj, ..., a dense MLP's gate_proj/up_proj/down_proj) or a mixture-of-experts "
        "block's expert parameters (experts.gate_up_proj, experts.down_proj), matched as name suffixes",
    )
    sync: Literal["auto", "adapter", "merged"] = Field(
        "auto",
        description="what the rollout engine receives after each step: the adapters (engines that load them), the "
        "merged weights, or auto: the adapters where the rollout engine can load these targets, else merged",
    )


class ModelConfig(Section):
    path: str | None = Field(None, description="an existing Hugging Face model folder; null builds `tiny`")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    dtype: Literal["float32", "bfloat16"] = "float32"
    lora: LoraConfig | None = Field(None, description="train LoRA adapters instead of every weight; null: full")


class TeacherConfig(Section):
    """A frozen model that scores every token the policy samples (on-policy distillation; :mod:`rlzoo.rl.teacher`,
    docs/distillation.md). It runs on the run's training engine and never trains; an advantage source that reads it
    (``needs_teacher``, e.g. ``reverse-kl``) turns its log-probs into the signal. Give ``model`` or ``tiny``."""

    model: str | None = Field(None, description="a Hugging Face model folder with the policy's tokenizer")
    tiny: TinyModelConfig | None = Field(
        None,
        description="a tiny model cold-started as the policy's is (same task, tokenizer and cold_start settings, "
        "these sizes), reused when its settings are unchanged",
    )
    output_dir: str | None = Field(None, description="where the tiny teacher's cold start is saved; null: "
                                   "<output_dir>/teacher_cold_start")

    @model_validator(mode="after")
    def _one_model(self) -> TeacherConfig:
        if (self.model is None) == (self.tiny is None):
            raise ValueError(
                "give exactly one of teacher.model (a Hugging Face model folder) and teacher.tiny (the sizes of a "
                "tiny model to cold-start)"
            )
        return self


class PromptConfig(Section):
    """How a sample becomes the prompt's token ids (:mod:`rlzoo.episodes.prompts`); the same ids for rollout, training,
    evaluation and the cold start. verl's names: ``data.max_prompt_length``, ``data.filter_overlong_prompts``,
    ``data.apply_chat_template_kwargs``."""

    plain: Literal["text", "chat"] = Field(
        "text",
        description="plain-string prompts: `text` encodes them as they are (no template); `chat` renders them as "
        "one user message through the tokenizer's chat template",
    )
    system: str | None = Field(None, description="a system message put first in chat prompts that have none")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="extra keyword arguments of the chat template, e.g. {enable_thinking: false} for Qwen3",
    )
    max_prompt_tokens: int | None = Field(None, ge=1, description="prompts longer than this are dropped or truncated")
    overlong_prompts: Literal["drop", "truncate"] = Field(
        "drop",
        description="drop: longer prompts leave the data set (counted in the log); truncate: keep their last "
        "max_prompt_tokens tokens (the generation prompt stays; counted in the log)",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_reserved_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted(set(value) & RESERVED_TEMPLATE_KWARGS)
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)} set by rlzoo itself (the prompt is rendered with add_generation_prompt=True "
                "and tokenized once); use other keys, such as enable_thinking"
            )
        return value


# apply_chat_template arguments rlzoo.episodes.prompts sets itself
RESERVED_TEMPLATE_KWARGS = {"conversation", "messages", "add_generation_prompt", "tokenize", "return_dict",
                            "continue_final_message", "return_tensors"}


class ColdStartConfig(Section):
    """Supervised fine-tuning on task demonstrations before RL (``rlzoo sft``)."""

    enabled: bool = True
    steps: int = Field(300, ge=0)
    batch_size: int = Field(32, ge=1)
    lr: LearningRate = 3e-3
    examples: int = Field(2000, ge=1, description="demonstrations drawn from the task's train split")
    output_dir: str | None = Field(None, description="where the cold-start model is saved (reused if present)")


class RolloutConfig(Section):
    engine: RolloutEngineSpec = Field(default_factory=lambda: RolloutEngineSpec(name=DEFAULT_ROLLOUT_ENGINE))
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=1)
    max_new_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    overlap: int = Field(
        0,
        ge=0,
        le=1,
        description="0: sample each step's batch at its start; 1: sample step t+1's batch while step t trains, by "
        "step t's weights (staleness 1; old log-probs under the sampling weights; rlzoo.rl.overlap, docs/overlap.md)",
    )
    per_rank: bool = Field(
        True,
        description="multi-process runs: every rank samples and scores its share of each step's prompts with its "
        "own engine, when the engine can (hf, vllm); false, or an engine that cannot: rank 0 samples everything",
    )


class TrainerConfig(Section):
    engine: TrainingEngineSpec = Field(default_factory=lambda: TrainingEngineSpec(name=DEFAULT_TRAINING_ENGINE))
    lr: LearningRate = 1e-4
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    grad_clip: float | None = Field(1.0, gt=0)
    dtype: Literal["float32", "bfloat16"] = "float32"
    max_tokens_per_micro_batch: int = Field(
        16384,
        ge=1,
        description="token budget of one forward: every pass (update, old / reference log-probs) runs in "
        "micro-batches whose padded token count stays under it (a longer single sequence gets a micro-batch of its "
        "own); the gradients of a minibatch's micro-batches accumulate into one optimizer step",
    )
    packing: bool = Field(
        True,
        description="pack several sequences into one row of a micro-batch (position ids restarting per sequence) "
        "where the model's attention supports it; otherwise rows are length-sorted",
    )
    activation_checkpointing: bool = Field(
        False, description="recompute each decoder layer in backward (the model's gradient checkpointing)"
    )
    logits_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="positions per chunk through the output layer: the largest logits tensor is [chunk, vocab]",
    )
    device_memory: str | None = Field(
        None,
        description="memory of one GPU, e.g. 80GB (10^9 bytes), 80GiB or 80e9: the preflight refuses a run whose "
        "estimated memory per rank (rlzoo.models.memory) exceeds it; null: no check",
    )

    @field_validator("device_memory", mode="before")
    @classmethod
    def _memory_size(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # YAML reads 8.0e+10 as a number
        if isinstance(value, str):
            parse_bytes(value)  # a ValueError names the accepted forms
        return value


class EpisodeConfig(Section):
    """What an episode is (:mod:`rlzoo.episodes.runner`): the environment that answers each turn, the tools it may call,
    and the limits. The default is one turn per episode, rlzoo's single-turn rollouts."""

    environment: EnvironmentSpec = Field(
        default_factory=lambda: EnvironmentSpec(name=DEFAULT_ENVIRONMENT),
        description="answers each policy turn with an observation or ends the episode",
    )
    tools: list[ToolSpec] = Field(default_factory=list, description="tools the episode's model may call")
    tool_parser: ToolParserSpec | None = Field(
        None, description=f"finds tool calls in the model's text; null with tools: {{name: {DEFAULT_TOOL_PARSER}}}"
    )
    max_turns: int = Field(1, ge=1, description="policy turns per episode at most (each up to rollout.max_new_tokens)")
    max_tokens: int | None = Field(
        None,
        ge=2,
        description="token budget of one episode: prompt, every turn and every observation; a turn that would pass "
        "it is cut there and the episode ends, counted in episode/truncated; null: the model's context",
    )

    @model_validator(mode="after")
    def _default_parser(self) -> EpisodeConfig:
        if self.tool_parser is None and self.tools:
            self.tool_parser = ToolParserSpec(name=DEFAULT_TOOL_PARSER)
        return self


class LoopConfig(Section):
    steps: int = Field(20, ge=0)
    eval_every: int = Field(5, ge=1)
    eval_prompts: int = Field(64, ge=1)
    eval_temperature: float = Field(0.0, ge=0, description="0 = greedy decoding for held-out accuracy")
    eval_samples_per_prompt: int = Field(1, ge=1, description="responses per held-out prompt (use >1 when sampling)")
    eval_pass_at_k: list[int] = Field(
        default_factory=list,
        description="log unbiased eval/pass@k (rlzoo.util.passk) for each k; each k <= eval_samples_per_prompt",
    )
    checkpoint_every: int = Field(5, ge=1)
    keep_checkpoints: int = Field(2, ge=1, description="older checkpoints are deleted")
    verifier_timeout_s: float | None = Field(
        None,
        gt=0,
        description="seconds a batch of responses may take to verify; responses not scored by then get reward 0 "
        "(counted in verifier/timeouts); null: no limit (verification runs in the main thread)",
    )
    max_consecutive_failures: int = Field(
        3,
        ge=1,
        description="the run stops after this many failed steps in a row (an update skipped for a non-finite loss "
        "or gradient, or no response of the batch scored); its last checkpoint is kept",
    )

    @field_validator("eval_pass_at_k")
    @classmethod
    def _k_within_samples(cls, ks: list[int], info: ValidationInfo) -> list[int]:
        samples = info.data.get("eval_samples_per_prompt")
        bad = [k for k in ks if k < 1 or (samples is not None and k > samples)]
        if bad:
            raise ValueError(
                f"{bad} not in 1..eval_samples_per_prompt ({samples}): pass@k needs at least k samples per prompt; "
                "raise train.eval_samples_per_prompt (with train.eval_temperature > 0) or drop those k"
            )
        return ks


class TrackingConfig(Section):
    """How experiment trackers (``loggers``) name and group this run; ``rlzoo ablate`` fills it for a sweep."""

    name: str | None = Field(None, description="the run's name in a tracker; null: the output folder's name")
    group: str | None = Field(None, description="the group of runs it belongs to (rlzoo ablate: the sweep folder's name)")
    tags: dict[str, str] = Field(
        default_factory=dict, description="labels (rlzoo ablate: cell, seed and each varied value)"
    )
    store_dir: str | None = Field(
        None,
        description="where a tracker keeps a local store several runs may share (MLflow's default database); "
        "null: the output folder (rlzoo ablate: the sweep folder)",
    )

    @field_validator("tags", mode="before")
    @classmethod
    def _tags_as_text(cls, tags: Any) -> Any:
        return {str(k): str(v) for k, v in tags.items()} if isinstance(tags, dict) else tags


class RunConfig(Section):
    seed: int = 0
    output_dir: str = "runs/default"
    model: ModelConfig = Field(default_factory=ModelConfig)
    teacher: TeacherConfig | None = Field(None, description="a frozen model scoring the policy's tokens; null: none")
    task: TaskSpec = Field(default_factory=lambda: TaskSpec(name="arithmetic"))
    verifier: VerifierSpec | None = Field(None, description="null: the task's default verifier")
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    cold_start: ColdStartConfig = Field(default_factory=ColdStartConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    train: LoopConfig = Field(default_factory=LoopConfig)
    loggers: list[LoggerSpec] = Field(
        default_factory=list,
        description="experiment trackers the run also logs to, e.g. [{name: wandb}, {name: mlflow}] "
        "(metrics.jsonl is always written); docs/loggers.md",
    )
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    def response_budget(self) -> int:
        """The most tokens the policy samples for one prompt: ``rollout.max_new_tokens`` per turn, times
        ``episode.max_turns`` (observations not counted): what length-based reward shapers measure against."""
        return self.rollout.max_new_tokens * self.episode.max_turns


# -- loading -------------------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError([("--set", f"{text!r} is not of the form dotted.key=value")])
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError([("--set", f"{text!r} has an empty key")])
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError([(".".join(path[: i + 1]), f"--set {text!r}: this is a value, not a section")])
            node = child
        node[path[-1]] = value
    return data


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (plain YAML keeps the last and silently
    drops the first, e.g. a whole ``trainer:`` block): :meth:`duplicate_keys` finds them in the composed nodes."""

    def duplicate_keys(self, root: yaml.Node | None) -> list[tuple[str, str]]:
        """``(dotted key, message)`` for every key repeated in a mapping of ``root``'s tree, in line order; ``<<``
        merge keys and the keys they bring in may repeat (an explicit key overrides a merged one, as YAML intends)."""
        found: list[tuple[int, str, str]] = []
        seen: set[int] = set()

        def walk(node: yaml.Node | None, loc: str) -> None:
            if node is None or id(node) in seen:  # an alias repeats a node already walked
                return
            seen.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                for i, item in enumerate(node.value):
                    walk(item, f"{loc}.{i}" if loc else str(i))
            if not isinstance(node, yaml.MappingNode):
                return
            first: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                scalar = isinstance(key_node, yaml.ScalarNode)
                name = str(key_node.value) if scalar else "?"
                child = f"{loc}.{name}" if loc else name
                if scalar and key_node.tag != "tag:yaml.org,2002:merge":
                    key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
                    if key in first:
                        found.append((line, child, f"duplicate key {name!r} at line {line} (first at line "
                                                   f"{first[key]}): YAML would keep the second and silently drop the "
                                                   "first; merge them into one"))
                    else:
                        first[key] = line
                walk(value_node, child)

        walk(root, "")
        return [(loc, message) for _, loc, message in sorted(found, key=lambda item: item[0])]


def _load_unique_keys(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, but a key repeated in a mapping is a :class:`ConfigError` naming it and both lines."""
    loader = UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        problems = loader.duplicate_keys(node)
        if problems:
            raise ConfigError(problems, source=source)
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([("", f"config file not found: {path}")])
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError([("", f"cannot read config file: {err}")], source=str(path)) from None
    try:
        data = _load_unique_keys(text, str(path))
    except yaml.YAMLError as err:
        raise ConfigError([("", f"not valid YAML: {err}")], source=str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([("", "the top level must be a mapping of sections")], source=str(path))
    return data


def iter_component_specs(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, ComponentSpec]]:
    for field_name in type(model).model_fields:
        value = getattr(model, field_name)
        loc = f"{prefix}.{field_name}" if prefix else field_name
        if isinstance(value, ComponentSpec):
            yield loc, value
        elif isinstance(value, list):  # a list of components (algorithm.reward_shaping): loc ends in the index
            yield from ((f"{loc}.{i}", item) for i, item in enumerate(value) if isinstance(item, ComponentSpec))
        elif isinstance(value, BaseModel):
            yield from iter_component_specs(value, loc)


def resolve_components(config: RunConfig, registry: Registry) -> tuple[RunConfig, list[tuple[str, str]]]:
    """Validate every component spec against the registry; return the config with defaults filled in."""
    problems: list[tuple[str, str]] = []
    replacements: dict[str, ComponentSpec] = {}
    for loc, spec in iter_component_specs(config):
        try:
            params = registry.validate_params(spec.kind, spec.name, spec.params, loc)
        except UnknownComponentError as err:
            problems.append((f"{loc}.name", str(err)))
            continue
        except ConfigError as err:
            problems.extend(err.problems)
            continue
        except RegistryError as err:
            problems.append((loc, str(err)))
            continue
        replacements[loc] = type(spec)(name=spec.name, **params.model_dump(mode="json"))
    data = config.model_dump(mode="python")
    for loc, spec in replacements.items():
        node = data
        *parents, leaf = loc.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(leaf) if isinstance(node, list) else leaf] = spec.model_dump(mode="json")
    return RunConfig.model_validate(data), problems


def fill_default_names(data: dict[str, Any], model: type[BaseModel] = None, loc: str = "") -> dict[str, Any]:
    """A component spec given without ``name`` (e.g. ``--set task.digits=3``) keeps the default component."""
    model = model or RunConfig
    for field_name, field in model.model_fields.items():
        value = data.get(field_name)
        if not isinstance(value, dict):
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, ComponentSpec) and "name" not in value:
            data[field_name] = {"name": default.name, **value}
        elif isinstance(default, BaseModel):
            fill_default_names(value, type(default))
    return data


def build_config(
    data: dict[str, Any],
    overrides: Sequence[str] = (),
    registry: Registry | None = None,
    source: str | None = None,
) -> RunConfig:
    data = apply_overrides(data, overrides)
    algorithm = data.get("algorithm")
    if isinstance(algorithm, dict):
        data["algorithm"] = expand_preset(algorithm)
    fill_default_names(data)
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err), source=source) from None
    config, problems = resolve_components(config, registry or default_registry())
    if problems:
        raise ConfigError(problems, source=source)
    return config


def load_config(path: str | Path, overrides: Sequence[str] = (), registry: Registry | None = None) -> RunConfig:
    """Read a YAML run config, apply ``--set`` overrides and presets, and validate everything."""
    return build_config(read_yaml(path), overrides, registry, source=str(path))


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
