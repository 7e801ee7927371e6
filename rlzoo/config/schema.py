"""The run config's schema: :class:`RunConfig` and its sections (pydantic models), with their validators.

A component is written ``{name: <registered name>, <its parameters>...}`` (:mod:`rlzoo.config.base`; the
``algorithm`` section's in :mod:`rlzoo.config.algorithm`). Validation is two-phase: pydantic checks the run's own
structure here, then :mod:`rlzoo.config.resolution` looks each component spec up in the plugin registry and validates
its parameters against that component's ``Params`` model. :mod:`rlzoo.config.loading` reads the YAML.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rlzoo.config.algorithm import AlgorithmConfig
from rlzoo.config.base import (
    DEFAULT_ROLLOUT_ENGINE,
    DEFAULT_TRAINING_ENGINE,
    Beta,
    LearningRate,
    PartialMode,
    Section,
    spec_class,
)
from rlzoo.config.episode import EpisodeConfig
from rlzoo.util.units import parse_bytes


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

    @property
    def moe(self) -> bool:
        """Whether the model's MLPs are mixtures of experts (the ``num_experts*`` and ``moe_*`` sizes apply)."""
        return self.architecture == "qwen3_moe"

    def shape_problems(self) -> list[tuple[str, str]]:
        """The shape rules a model built from these sizes must meet, as ``(field, message)`` pairs.

        transformers repeats each key/value head over ``heads / kv_heads`` query heads (grouped-query attention),
        rotates ``head_dim`` in pairs (RoPE), and picks ``num_experts_per_tok`` of ``num_experts``. An engine's
        own limits (vLLM's head sizes) are that engine's check (``Component.preflight``).
        """
        problems = []
        if self.num_attention_heads % self.num_key_value_heads:
            divisors = [d for d in range(1, self.num_attention_heads + 1) if self.num_attention_heads % d == 0]
            problems.append(
                (
                    "num_key_value_heads",
                    f"{self.num_key_value_heads} does not divide num_attention_heads={self.num_attention_heads}; "
                    f"use one of {divisors}",
                )
            )
        if self.head_dim % 2:
            problems.append(("head_dim", f"{self.head_dim} is odd; rotary embeddings need an even head_dim"))
        if self.moe and self.num_experts_per_tok > self.num_experts:
            problems.append(
                (
                    "num_experts_per_tok",
                    f"{self.num_experts_per_tok} exceeds num_experts={self.num_experts}; use 1..{self.num_experts}",
                )
            )
        return problems


#: what model.lora targets unless told: every attention projection (dense and MoE models alike)
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class LoraConfig(Section):
    """LoRA adapters on the policy (:mod:`rlzoo.engines.lora`, through peft): only the adapters train, the KL
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
    output_dir: str | None = Field(
        None, description="where the tiny teacher's cold start is saved; null: <output_dir>/teacher_cold_start"
    )

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
RESERVED_TEMPLATE_KWARGS = {
    "conversation",
    "messages",
    "add_generation_prompt",
    "tokenize",
    "return_dict",
    "continue_final_message",
    "return_tensors",
}


class ColdStartConfig(Section):
    """Supervised fine-tuning on task demonstrations before RL (``rlzoo sft``)."""

    enabled: bool = True
    steps: int = Field(300, ge=0)
    batch_size: int = Field(32, ge=1)
    lr: LearningRate = 3e-3
    examples: int = Field(2000, ge=1, description="demonstrations drawn from the task's train split")
    output_dir: str | None = Field(None, description="where the cold-start model is saved (reused if present)")


class RolloutConfig(Section):
    engine: spec_class("rollout_engine") = Field(
        default_factory=lambda: spec_class("rollout_engine")(name=DEFAULT_ROLLOUT_ENGINE)
    )
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=1)
    max_new_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    overlap: int = Field(
        0,
        ge=0,
        le=1,
        description="0: sample each step's batch at its start; 1: sample step t+1's batch while step "
        "t trains, by step t's weights (staleness 1; old log-probs under the sampling weights; rlzoo.rl.overlap, "
        "docs/overlap.md)",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="null: sample each step's batch in the loop (or by rollout.overlap); k: a producer "
        "thread samples continuously, at most k weight versions ahead of the trainer (0: in lockstep, the synchronous "
        "order of work; rlzoo.rl.async_rollouts, docs/async.md)",
    )
    queue_size: int | None = Field(
        None,
        ge=1,
        description="with max_staleness: how many responses may wait sampled for the trainer (at least one step's, "
        "prompts_per_step x group_size); null: max_staleness steps' worth (one step's with k = 0)",
    )
    partial: PartialMode = Field(
        "off",
        description="with max_staleness: off finishes a generation in flight by the weights it started with; "
        "continue stops it at newer weights, loads them and goes on from each response's prefix; restart samples the "
        "unfinished responses again (an engine that declares updates_in_flight: hf, vllm, vllm-server)",
    )
    per_rank: bool = Field(
        True,
        description="multi-process runs: every rank samples and scores its share of each step's prompts with its "
        "own engine, when the engine can (hf, vllm); false, or an engine that cannot: rank 0 samples everything",
    )


class TrainerConfig(Section):
    engine: spec_class("training_engine") = Field(
        default_factory=lambda: spec_class("training_engine")(name=DEFAULT_TRAINING_ENGINE)
    )
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
    group: str | None = Field(
        None, description="the group of runs it belongs to (rlzoo ablate: the sweep folder's name)"
    )
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
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="where the hf rollout engine and the torch training engines run: auto = cuda when torch "
        "sees a GPU, else cpu; DeepSpeed places its engines itself, vLLM by its build",
    )
    plugins: list[str] = Field(
        default_factory=list,
        description="Python files (./my_loss.py, relative to this file's folder) or modules (my_pkg.my_module) whose "
        "components the config may name; loaded before the components are resolved (docs/writing-a-plugin.md)",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    teacher: TeacherConfig | None = Field(None, description="a frozen model scoring the policy's tokens; null: none")
    task: spec_class("task") = Field(default_factory=lambda: spec_class("task")(name="arithmetic"))
    verifier: spec_class("verifier") | None = Field(None, description="null: the task's default verifier")
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    cold_start: ColdStartConfig = Field(default_factory=ColdStartConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    train: LoopConfig = Field(default_factory=LoopConfig)
    loggers: list[spec_class("logger")] = Field(
        default_factory=list,
        description="experiment trackers the run also logs to, e.g. [{name: wandb}, {name: mlflow}] "
        "(metrics.jsonl is always written); docs/loggers.md",
    )
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    def response_budget(self) -> int:
        """The most tokens the policy samples for one prompt: ``rollout.max_new_tokens`` per turn, times
        ``episode.max_turns`` (observations not counted): what length-based reward shapers measure against."""
        return self.rollout.max_new_tokens * self.episode.max_turns
