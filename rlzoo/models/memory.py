"""GPU memory per rank of a run, estimated from the model's shapes and the run config before anything is built.

:func:`estimate` is a pure function of a :class:`ModelShape` (read from the model's transformers ``config.json``, or
``model.tiny``), the resolved :class:`rlzoo.config.schema.RunConfig`, the number of processes and the run's
engines (constructed, not started; each answers for its own part). It returns a
:class:`MemoryEstimate`: named parts in bytes for the most loaded rank (rank 0, which always holds a rollout engine),
plus vLLM's share of the device. :mod:`rlzoo.preflight.memory_fit` compares it with ``trainer.device_memory`` (or ``rlzoo
config check --device-memory``). It is arithmetic, not a measurement: what it leaves out is listed below.

Notation: ``P`` parameters, of which ``Pe`` routed-expert parameters (``Pd = P - Pe`` the rest); ``N`` processes
(data-parallel ranks); ``s`` the ZeRO stage and ``ep`` the expert-parallel ranks, as the training engine states them
(:class:`TrainingLayout`; DeepSpeed's ``zero_stage`` and ``ep_size`` with ``moe: deepspeed``, else 1; the ``torch``
engine: 0 and 1); ``c`` the bytes of ``trainer.dtype`` (2 for bfloat16, 4 for float32);
``T`` = ``trainer.max_tokens_per_micro_batch``; ``h`` hidden size, ``L`` decoder layers, ``V`` vocabulary,
``q = heads x head_dim``, ``kv = kv_heads x head_dim``, ``I`` the dense MLP width, ``E`` experts, ``k`` experts
per token, ``Im`` one expert's MLP width.

Parameter count (Qwen3 / Llama layout; biases, and attention other than grouped-query, are not modelled)::

    P = V h (embedding) + V h (output layer, unless tied) + h (final norm)
        + L (h q + 2 h kv + q h + 2 h + 2 head_dim)             attention, the two RMSNorms, q/k norms
        + dense layers x 3 h I + MoE layers x (E h + E 3 h Im)   SwiGLU MLP; router and routed experts

The training engines keep fp32 master weights and run the forward under bf16 autocast. Per rank, with
``local = Pd + Pe / ep`` (the weights a rank holds whole) and ``shard = P / N`` (its ZeRO partition)::

    weights       4 x (shard if s == 3 else local)
    master_copy   4 x shard if s in (1, 2)             DeepSpeed ZeRO 1-2 clone the rank's fp32 partition
    gradients     4 x (shard if s >= 2 else local)
    optimizer     8 x (shard if s >= 1 else local)     AdamW's two moments, fp32
    gathered      ZeRO-3 only: 4 x 2 x the largest module (a decoder layer, the embedding or the output layer),
                  the one computing and the one prefetched; it also covers the weight push, which gathers one such
                  module at a time plus the copy of one tensor (:mod:`rlzoo.engines.deepspeed.layerwise`)
    weight_copies bfloat16 only: 2 x the non-expert weights (autocast caches the bf16 cast of every fp32 weight
                  it uses until the forward ends, whatever ZeRO partitions), plus 2 x the expert weights that
                  stay alive: all local experts with ``moe: deepspeed`` (its experts are Linear modules, cached
                  like the rest) or without activation checkpointing (saved for backward), else one layer's

Activations of one micro-batch of ``T`` tokens (SDPA / flash attention assumed: nothing quadratic in the length).
Saved for backward, per token and decoder layer::

    a = 4 x 4 h                          fp32: the layer input, the attention residual sum, the two RMSNorm
                                         outputs (the residual stream is fp32 because the weights are)
      + c x (2 h + 4 q + 4 kv + mlp)     the normed states cast into the projections; q, k: projection, norm,
                                         rotary, and the attention output / v
      mlp = 4 I                          dense: gate, up, act(gate), act(gate) x up
          | k (2 h + 4 Im) + E x 4 / c   MoE: each routed copy's input, output and four intermediates; fp32 router

    activations = T x L x a                              without activation checkpointing
                = T x L x 4 h + T x a                    with it: each layer's fp32 input, one layer recomputed

Output layer, in chunks of ``trainer.logits_chunk_tokens`` positions::

    logits = logits_chunk_tokens x V x 4 bytes x 4       fp32 logits, log-softmax, softmax (entropy), gradient

The KL reference (``algorithm.kl_coef > 0`` or ``algorithm.kl_in_reward``) is a second training engine of the same
kind, loaded from the initial model (:mod:`rlzoo.runtime.run`): its ``weights`` and ``master_copy`` as above; it never steps
(no gradients, no optimizer state). Under LoRA (``model.lora``) the reference is the policy's base (0 more), and only
the adapters' ``Pa = r (in + out)`` per wrapped matrix (:meth:`ModelShape.lora_parameters`) take the place of ``P``
in ``master_copy``, ``gradients`` and ``optimizer``; ``weights`` hold ``P + Pa``. A critic (``algorithm.critic``, :mod:`rlzoo.rl.critic`) is another training engine
that does step: ``critic`` is the policy's weights, master copy, gradients and optimizer again (its value head
replaces the output layer; counted as the policy's size); its passes run between the policy's, so no activations. A
teacher (``teacher``, :mod:`rlzoo.rl.teacher`) is a third, frozen one of the teacher's own shape: ``teacher`` is its
``weights`` and ``master_copy``, as the reference's. The rollout engine shares the GPU with the trainer (rlzoo
colocates them; rank 0 always holds one); each rollout engine states its own part
(:meth:`rlzoo.engines.RolloutEngine.memory`), rlzoo's as follows::

    vllm  gpu_memory_utilization x device memory (vLLM's budget for its weights, activations and KV cache), if set;
          else kv_cache_memory_bytes + P x model.dtype bytes / tensor_parallel_size
    vllm-server  0 on the trainer's devices; each server, on devices of its own, as vllm's per device (``pool``)
    other a private copy of the policy: P x model.dtype bytes, plus for ``hf`` generate's KV cache:
          rows x (prompt.max_prompt_tokens + rollout.max_new_tokens) x L x 2 kv x model.dtype bytes, with
          rows = min(batch_size, the rows this rank samples)

Fixed parts: ``communication`` (more than one process: DeepSpeed's default reduce bucket, 5e8 elements in fp32, or
the local weights if smaller) and ``runtime`` (:data:`RUNTIME_BYTES`: CUDA context, kernels' workspaces).

Not modelled: allocator fragmentation, vLLM's CUDA graphs beyond its budget, the old / reference log-prob passes
(no-grad forwards, smaller than the update's), the batch tensors, DeepSpeed buffers other than the reduce bucket,
shared experts, multi-head latent attention and other layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlzoo.util.units import GiB, format_bytes

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig, TinyModelConfig

REQUIRED_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")  # config.json keys
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")  # transformers configs naming the expert count
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
MASTER_BYTES = 4  # fp32 master weights and gradients
ADAM_BYTES = 8  # AdamW's two fp32 moments per parameter
LOGITS_COPIES = 4  # fp32 logits, log-softmax, softmax, their gradient
FP32_HIDDEN_PER_LAYER = 4  # fp32 [h] tensors a decoder layer saves per token (see the module docstring)
REDUCE_BUCKET_ELEMENTS = 5 * 10**8  # DeepSpeed's default reduce_bucket_size (rlzoo does not change it)
RUNTIME_BYTES = 1 * GiB  # CUDA context and kernels' workspaces, per GPU
TINY_VOCAB = 256  # the cold start's character tokenizer: the task's characters and three specials, at most this
GPU_SCALE_PARAMETERS = 10**8  # `rlzoo config check` prints the estimate for models at least this large

# -- the model -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that decide its memory; ``experts == 0`` for a dense model."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # the dense MLP's width
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0  # one routed expert's MLP width
    moe_layers: int = 0  # decoder layers whose MLP is a mixture of experts
    tied_embeddings: bool = False

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelShape | None:
        """From a transformers ``config.json`` (its ``text_config`` if nested); ``None`` if a size is missing."""
        hf = hf["text_config"] if isinstance(hf.get("text_config"), dict) else hf

        def size(key: str, default: int | None = None) -> int | None:
            value = hf.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default

        vocab, hidden, layers, heads = (size(k) for k in REQUIRED_SIZES)
        if None in (vocab, hidden, layers, heads):
            return None
        experts = next((size(k) for k in MOE_KEYS if size(k)), 0)
        intermediate = size("intermediate_size", 4 * hidden)
        listed = hf.get("mlp_only_layers")
        dense = set(listed if isinstance(listed, list) else []) | set(range(size("first_k_dense_replace", 0)))
        step = size("decoder_sparse_step", 1)
        moe_layers = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0) if experts else 0
        return cls(
            vocab=vocab, hidden=hidden, layers=layers, heads=heads,
            kv_heads=size("num_key_value_heads", heads),
            head_dim=size("head_dim", hidden // heads),
            intermediate=intermediate,
            experts=experts,
            top_k=size("num_experts_per_tok", 1) if experts else 0,
            moe_intermediate=size("moe_intermediate_size", intermediate) if experts else 0,
            moe_layers=moe_layers,
            tied_embeddings=hf.get("tie_word_embeddings") is True,
        )

    @classmethod
    def from_tiny(cls, tiny: TinyModelConfig) -> ModelShape:
        """``model.tiny`` as :mod:`rlzoo.models.tiny` builds it (untied; the vocabulary at most :data:`TINY_VOCAB`)."""
        moe = tiny.moe
        return cls(
            vocab=TINY_VOCAB, hidden=tiny.hidden_size, layers=tiny.num_hidden_layers,
            heads=tiny.num_attention_heads, kv_heads=tiny.num_key_value_heads, head_dim=tiny.head_dim,
            intermediate=tiny.intermediate_size,
            experts=tiny.num_experts if moe else 0,
            top_k=tiny.num_experts_per_tok if moe else 0,
            moe_intermediate=tiny.moe_intermediate_size if moe else 0,
            moe_layers=tiny.num_hidden_layers if moe else 0,
        )

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    def attention_parameters(self) -> int:
        """One layer's attention, its two RMSNorms and Qwen3's q / k norms."""
        h = self.hidden
        return h * self.q + 2 * h * self.kv + self.q * h + 2 * h + 2 * self.head_dim

    def layer_expert_parameters(self) -> int:
        """The routed experts of one MoE layer (a SwiGLU MLP each)."""
        return self.experts * 3 * self.hidden * self.moe_intermediate

    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    def largest_layer_parameters(self) -> int:
        """The largest decoder layer: attention + its MLP (the experts and router of an MoE layer)."""
        dense = 3 * self.hidden * self.intermediate if self.moe_layers < self.layers else 0
        moe = self.experts * self.hidden + self.layer_expert_parameters() if self.moe_layers else 0
        return self.attention_parameters() + max(dense, moe)

    def expert_parameters(self) -> int:
        """``Pe``: all routed experts."""
        return self.moe_layers * self.layer_expert_parameters()

    def lora_parameters(self, rank: int, targets: list[str]) -> int:
        """``Pa``: LoRA adapters of ``rank`` on ``targets`` (``model.lora.target_modules``), ``r (in + out)`` per
        wrapped matrix, per expert for fused expert weights; names of no Qwen3 projection count 0."""
        h, i, e, m = self.hidden, self.intermediate, self.experts, self.moe_intermediate
        dense_layers = self.layers - self.moe_layers
        per_name = {
            "q_proj": self.layers * (h + self.q), "k_proj": self.layers * (h + self.kv),
            "v_proj": self.layers * (h + self.kv), "o_proj": self.layers * (self.q + h),
            "gate_proj": dense_layers * (h + i), "up_proj": dense_layers * (h + i),
            "down_proj": dense_layers * (i + h) + (self.moe_layers * e * (m + h) if "experts.down_proj" not in targets else 0),
            "experts.gate_up_proj": self.moe_layers * e * (h + 2 * m), "experts.down_proj": self.moe_layers * e * (m + h),
        }
        return rank * sum(per_name.get(name.removeprefix("mlp."), 0) for name in set(targets))

    def parameters(self) -> int:
        """``P``: every parameter (see the module docstring's formula)."""
        h = self.hidden
        embeddings = self.embedding_parameters() * (1 if self.tied_embeddings else 2) + h
        mlps = (self.layers - self.moe_layers) * 3 * h * self.intermediate + self.moe_layers * self.experts * h
        return embeddings + self.layers * self.attention_parameters() + mlps + self.expert_parameters()


# -- the estimate ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    """Named parts in bytes, per rank; ``device_fraction``: vLLM's ``gpu_memory_utilization``, a share of the
    device rather than bytes (0 when vLLM's size is given in bytes, or the rollout engine is not vLLM)."""

    parts: dict[str, int]
    parameters: int
    device_fraction: float = 0.0
    rollout_weights: int = 0  # the rollout engine's copy of the policy on one GPU (within ``rollout``'s share)
    rollout_pool: tuple[str, ...] = ()  # RolloutMemory.pool: rollout servers on devices of their own

    def total(self, device_memory: int | None = None) -> int:
        """All parts; vLLM's share counts only when ``device_memory`` is given."""
        share = self.device_fraction * device_memory if device_memory is not None else 0
        return sum(self.parts.values()) + int(share)

    def fits(self, device_memory: int) -> bool:
        return self.total(device_memory) <= device_memory

    def bytes_on(self, device_memory: int | None = None) -> dict[str, int]:
        """The parts in bytes, vLLM's share of ``device_memory`` (if given) counted in ``rollout``."""
        share = int(self.device_fraction * device_memory) if device_memory is not None else 0
        return dict(self.parts, rollout=self.parts["rollout"] + share)

    def lines(self, device_memory: int | None = None) -> list[str]:
        """The breakdown, one part per line, largest first, then the total."""
        parts = {name: size for name, size in self.bytes_on(device_memory).items() if size or name == "rollout"}
        if not parts["rollout"] and not self.device_fraction:
            del parts["rollout"]
        share = f"  ({self.device_fraction:g} x device memory: vLLM's gpu_memory_utilization)"
        notes = {"rollout": share} if self.device_fraction else {}
        lines = [f"{name:<14}{format_bytes(size) if size else '?':>9}{notes.get(name, '')}"
                 for name, size in sorted(parts.items(), key=lambda item: -item[1])]
        unknown = " + vLLM's share" if self.device_fraction and device_memory is None else ""
        return [*lines, f"{'total':<14}{format_bytes(self.total(device_memory)):>9}{unknown}"]


@dataclass(frozen=True)
class TrainingLayout:
    """How a training engine holds the policy's training state on each rank (the module docstring's ``s``, ``ep``):
    what :meth:`rlzoo.engines.TrainingEngine.memory_layout` answers. The default is the whole state on every rank."""

    zero_stage: int = 0  # 1: the optimizer state partitioned over the ranks; 2: and the gradients; 3: and weights
    expert_parallel: int = 1  # ranks the routed experts are split over
    experts_as_linear: bool = False  # the experts are Linear modules, so autocast caches their bf16 copies


@dataclass(frozen=True)
class RolloutMemory:
    """What :meth:`rlzoo.engines.RolloutEngine.memory` answers: the rollout engine's bytes on a rank's GPU, or a
    share of the device (``device_fraction``, e.g. vLLM's ``gpu_memory_utilization``) instead; ``weights``: its copy
    of the policy within that."""

    bytes: int
    weights: int
    device_fraction: float = 0.0
    pool: tuple[str, ...] = ()  # servers on devices of their own (not in bytes): their placement and memory, as lines


def estimate(
    config: RunConfig, shape: ModelShape, world: int = 1, *, training: Any, rollout: Any,
    teacher: ModelShape | None = None,
) -> MemoryEstimate:
    """GPU memory of the most loaded rank of ``config`` (resolved) on ``world`` processes, by the module's formula.

    ``training`` / ``rollout``: the config's engines, constructed (not started;
    :func:`rlzoo.preflight.memory_fit.estimate` constructs those not given from a registry). Each answers for its own
    part (:meth:`~rlzoo.engines.TrainingEngine.memory_layout`, :meth:`~rlzoo.engines.RolloutEngine.memory`).
    ``teacher``: the teacher's shape, if the run has one."""
    layout = training.memory_layout()
    lora = config.model.lora
    adapters = shape.lora_parameters(lora.rank, lora.target_modules) if lora is not None else None
    parts = _training_parts(config, shape, world, layout, adapters)
    parts["activations"] = _activation_bytes(config, shape)
    parts["logits"] = config.trainer.logits_chunk_tokens * shape.vocab * 4 * LOGITS_COPIES
    # under LoRA the reference is the policy's own base (its adapters disabled): nothing more
    needs_reference = (config.algorithm.kl_coef > 0 or config.algorithm.kl_in_reward is not None) and lora is None
    parts["reference"] = parts["weights"] + parts["master_copy"] if needs_reference else 0
    # a teacher is frozen as the reference is, in its own shape: weights in the engine's layout, nothing that steps
    frozen = _training_parts(config, teacher, world, layout) if teacher is not None else {}
    parts["teacher"] = frozen.get("weights", 0) + frozen.get("master_copy", 0)
    # a critic holds a second training state of the policy's shape (its passes run between the policy's, so its
    # activations are not added)
    critic = config.algorithm.critic is not None
    parts["critic"] = sum(_training_parts(config, shape, world, layout).values()) if critic else 0
    sampling = rollout.memory(config, shape, world)
    parts["rollout"] = sampling.bytes
    local = _local_parameters(shape, layout)
    parts["communication"] = MASTER_BYTES * min(REDUCE_BUCKET_ELEMENTS, local) if world > 1 else 0
    parts["runtime"] = RUNTIME_BYTES
    return MemoryEstimate(parts, shape.parameters(), sampling.device_fraction, sampling.weights, sampling.pool)


def _local_parameters(shape: ModelShape, layout: TrainingLayout) -> int:
    """``Pd + Pe / ep``: the parameters a rank holds whole (expert parallelism splits the experts)."""
    experts = shape.expert_parameters()
    return shape.parameters() - experts + experts // layout.expert_parallel


def _training_parts(
    config: RunConfig, shape: ModelShape, world: int, layout: TrainingLayout, adapters: int | None = None
) -> dict[str, int]:
    """weights, master_copy, gradients, optimizer, gathered and weight_copies (module docstring); ``adapters``:
    LoRA's ``Pa``, the only parameters with a master copy, gradients and optimizer state."""
    stage = layout.zero_stage
    local, shard = _local_parameters(shape, layout), shape.parameters() // max(world, 1)
    largest = max(shape.largest_layer_parameters(), shape.embedding_parameters())
    trained_local, trained_shard = (local, shard) if adapters is None else (adapters, adapters // max(world, 1))
    parts = {
        "weights": MASTER_BYTES * ((shard if stage == 3 else local) + (adapters or 0)),
        "master_copy": MASTER_BYTES * trained_shard if stage in (1, 2) else 0,
        "gradients": MASTER_BYTES * (trained_shard if stage >= 2 else trained_local),
        "optimizer": ADAM_BYTES * (trained_shard if stage >= 1 else trained_local),
        "gathered": MASTER_BYTES * 2 * largest if stage == 3 else 0,
        "weight_copies": 0,
    }
    if config.trainer.dtype != "float32":
        experts = shape.expert_parameters() // layout.expert_parallel
        if not layout.experts_as_linear and config.trainer.activation_checkpointing:
            experts = shape.layer_expert_parameters() if shape.moe_layers else 0
        non_expert = shape.parameters() - shape.expert_parameters()
        parts["weight_copies"] = DTYPE_BYTES[config.trainer.dtype] * (non_expert + experts)
    return parts


def layer_activation_bytes(shape: ModelShape, dtype: str) -> int:
    """``a``: bytes one decoder layer saves for backward per token (the module docstring's formula)."""
    c, h = DTYPE_BYTES[dtype], shape.hidden
    if shape.moe_layers:
        mlp = shape.top_k * (2 * h + 4 * shape.moe_intermediate) * c + shape.experts * 4
    else:
        mlp = 4 * shape.intermediate * c
    return FP32_HIDDEN_PER_LAYER * h * 4 + c * (2 * h + 4 * shape.q + 4 * shape.kv) + mlp


def _activation_bytes(config: RunConfig, shape: ModelShape) -> int:
    """One micro-batch of ``trainer.max_tokens_per_micro_batch`` tokens through the decoder layers."""
    tokens, layer = config.trainer.max_tokens_per_micro_batch, layer_activation_bytes(shape, config.trainer.dtype)
    if config.trainer.activation_checkpointing:
        return tokens * shape.layers * shape.hidden * 4 + tokens * layer
    return tokens * shape.layers * layer


def policy_bytes(config: RunConfig, shape: ModelShape) -> int:
    """One copy of the policy's weights in ``model.dtype`` (what a rollout engine holds)."""
    return shape.parameters() * DTYPE_BYTES[config.model.dtype]


def kv_cache_bytes(config: RunConfig, shape: ModelShape, tokens: int) -> int:
    """The key/value cache of ``tokens`` tokens in ``model.dtype``: every layer keeps a key and a value per token."""
    return tokens * shape.layers * 2 * shape.kv * DTYPE_BYTES[config.model.dtype]
