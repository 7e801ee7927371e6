"""Engine interfaces: where rollouts are sampled and where the policy is trained.

The loop talks to engines only through these two classes, so transformers-generate and vLLM, plain torch and
DeepSpeed are interchangeable. Log-probs everywhere are of the model's own distribution at temperature 1
(vLLM's ``raw_logprobs``), of the sampled tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import torch

from rlzoo.engines.adapter import Adapter
from rlzoo.engines.gradients import GradientRequest
from rlzoo.interfaces.base import Component
from rlzoo.models.memory import RolloutMemory, TrainingLayout, policy_bytes

if TYPE_CHECKING:
    from rlzoo.config.schema import LoraConfig, RunConfig
    from rlzoo.interfaces.run_facts import RunFacts
    from rlzoo.models.memory import ModelShape
    from rlzoo.moe import Layout, Routing


@dataclass
class SamplingSettings:
    n: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


class InFlightUpdates(Protocol):
    """What a rollout engine that follows weight updates in flight is given (``rollout.partial``)."""

    mode: Literal["continue", "restart"]  # an unfinished response goes on from its prefix, or starts again

    def pending(self) -> bool:
        """Newer weights are published than the engine holds (checked after each sampled token)."""

    def load(self) -> int:
        """Load the newest published weights into the engine; their version."""

    def version(self) -> int:
        """The version of the weights the engine holds."""


@dataclass
class Generation:
    """One sampled response, or one multi-turn episode (:mod:`rlzoo.episodes.runner`) as one token sequence.

    response_ids:      sampled token ids, including the end-of-sequence token when one was produced; in an
                       episode every turn's tokens and, between them, the observations' tokens.
    response_logprobs: the rollout engine's log-prob of each sampled token (0 for an observation's tokens).
    routing:           optional ``[len(prompt_ids) + len(response_ids) - 1, layers, top_k]`` expert indices the
                       rollout engine used (the last sampled token is never run through the model); in an
                       episode stitched from its turns (:func:`rlzoo.moe.stitch_routing`).
    policy_mask:       per response token, 1 if the policy sampled it, 0 for an observation's token (in the
                       context, out of the loss); ``None``: every token is the policy's (one turn).
    turns:             ``(start, end)`` response indices of each turn's policy tokens; ``None``: one turn.
    turn_rewards:      the environment's reward for each turn (``None``: none given).
    truncated:         the episode was ended by a limit (``episode.max_turns``, ``episode.max_tokens``, a turn
                       cut at ``rollout.max_new_tokens``), not by its environment.
    versions:          per response token, the weight version that sampled it, when the engine followed weight
                       updates in flight (``rollout.partial: continue|restart``); ``None``: not recorded. In an
                       episode an observation's tokens carry the version of the token before them (no version
                       sampled them; ``policy_mask`` 0).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    finished: bool
    routing: torch.Tensor | None = None
    policy_mask: list[int] | None = None
    turns: list[tuple[int, int]] | None = None
    turn_rewards: list[float] | None = None
    truncated: bool = False
    versions: list[int] | None = None

    @property
    def policy_tokens(self) -> int:
        """How many response tokens the policy sampled (observations' tokens excluded)."""
        return len(self.response_ids) if self.policy_mask is None else sum(self.policy_mask)

    @property
    def last_turn_ids(self) -> list[int]:
        """The last turn's sampled ids: what the verifier reads (the whole response for one turn)."""
        if not self.turns:
            return self.response_ids
        start, end = self.turns[-1]
        return self.response_ids[start:end]


@dataclass
class EngineContext:
    """What every engine is started with.

    ``head`` (training engines): ``"lm"`` trains a policy, whose per-token outputs are the log-probs of the response
    tokens; ``"value"`` trains a critic (:mod:`rlzoo.rl.critic`): the model in ``model_dir`` with a scalar value head
    (a fresh one, seeded by ``seed``, when the folder holds a causal LM), whose per-token output is the value of
    the state before each response token. Only engines that declare ``trains_values`` accept ``"value"``.
    """

    model_dir: Path
    dtype: str = "float32"
    seed: int = 0
    eos_token_id: int = 0
    pad_token_id: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    head: Literal["lm", "value"] = "lm"
    lora: LoraConfig | None = None
    sends_adapters: bool = False  # a rollout engine receives lora's adapters, not merged weights (engines.lora rule)
    device: str = "cpu"  # where an engine that places its own model puts it: "cpu" or "cuda:<index>"
    run_dir: Path | None = None  # the run's folder: where an engine keeps its own files (rollout servers' logs)


class RolloutEngine(Component):
    """Samples groups of responses and receives new weights after every optimizer step.

    Capabilities (class attributes, read by the run's assembly; never probed):

    - ``can_record_routing``: can return each generation's MoE experts (``Generation.routing``) when asked through
      :meth:`set_record_routing`.
    - ``runs_under_launcher``: can live inside rank 0 of a multi-process run started by torchrun/deepspeed.
    - ``runs_per_rank``: one engine per rank of such a run can sample at the same time, each in its own process
      (colocated with that rank's training engine), without a process group of its own. Then every rank samples
      its share of each step's prompts (``rollout.per_rank``) and receives the weights after every update.
    - ``loads_adapters``: started with ``EngineContext.lora`` (the policy trains LoRA adapters, ``model.lora``), it
      can receive the adapters themselves (:meth:`sync_adapter`) instead of the merged weights, for the targets
      :meth:`adapter_targets_supported` accepts.
    - ``updates_in_flight``: it can stop a generation when newer weights are published, load them and continue the
      unfinished responses from their prefix or restart them (``rollout.partial: continue|restart``), through
      :meth:`follow_updates`; hf and vllm can.
    - ``context_option``: the ``rollout.engine`` parameter that sets :meth:`context_tokens` (vLLM: ``max_model_len``).
    """

    kind = "rollout_engine"
    can_record_routing: ClassVar[bool] = False
    loads_adapters: ClassVar[bool] = False
    runs_under_launcher: ClassVar[bool] = True
    runs_per_rank: ClassVar[bool] = False
    updates_in_flight: ClassVar[bool] = False
    context_option: ClassVar[str | None] = None

    def start(self, context: EngineContext) -> None:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Generation]]:
        """For each prompt (token ids), ``sampling.n`` generations."""
        raise NotImplementedError

    def follow_updates(self, updates: InFlightUpdates | None) -> None:
        """From now on, stop generating when ``updates.pending()``, load the new weights (``updates.load()``) and
        continue or restart the unfinished responses (``updates.mode``), recording each token's version in
        ``Generation.versions``; ``None``: generate with the weights held (engines declaring ``updates_in_flight``)."""
        raise NotImplementedError(f"rollout engine {self.name!r} cannot update its weights in flight")

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging-Face-named weights into the engine without rebuilding it."""
        raise NotImplementedError

    def sync_adapter(self, adapter: Adapter) -> None:
        """Sample with ``adapter`` on the base weights from now on (only engines with ``loads_adapters``)."""
        raise NotImplementedError(f"rollout engine {self.name!r} cannot load LoRA adapters (loads_adapters is False)")

    def adapter_targets_supported(self, targets: list[str], moe: bool) -> str | None:
        """Why this engine cannot load adapters on ``targets`` (``model.lora.target_modules``) of a dense (or, with
        ``moe``, a mixture-of-experts) model, or ``None`` when it can. Asked before :meth:`start`."""
        return None if self.loads_adapters else f"rollout engine {self.name!r} does not load LoRA adapters"

    def set_record_routing(self, enabled: bool) -> None:
        """Record (or stop recording) the experts of every generation; only engines with ``can_record_routing``."""
        raise NotImplementedError(f"rollout engine {self.name!r} cannot record MoE routing")

    def close(self) -> None:
        pass

    # -- what the start-up check asks (before :meth:`start`; see also Component.preflight) --------------------------

    def context_tokens(self) -> int | None:
        """The most prompt + response tokens it accepts (``None``: the model's positions). The run gives prompts
        ``P + max_new_tokens <=`` the smaller of the two (dropping longer ones, counted); an engine refuses one with
        less room for its response rather than cut the response short."""
        return None

    def memory(self, config: RunConfig, shape: ModelShape, world: int) -> RolloutMemory:
        """This engine's part of a rank's GPU memory (:mod:`rlzoo.models.memory`); the base assumes a private
        copy of the policy in ``model.dtype`` and nothing else."""
        weights = policy_bytes(config, shape)
        return RolloutMemory(bytes=weights, weights=weights)

    def memory_hint(self, run: RunFacts) -> str:
        """What shrinks this engine's part of the memory, for the message of a run that does not fit."""
        return f"the rollout engine {self.name!r} holds its own copy of the weights"


@dataclass
class TokenBatch:
    """A padded batch for log-prob computation.

    input_ids:      ``[B, P+T]`` prompt then response tokens, left-aligned, padded on the right.
    attention_mask: ``[B, P+T]``.
    response_start: ``[B]`` index of each row's first response token.
    response_mask:  ``[B, T]`` 1 on response tokens; column ``t`` is response token ``t`` of each row.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_start: torch.Tensor
    response_mask: torch.Tensor


#: ``loss_fn(logp) -> (loss, metrics)``; with ``train_step(..., with_entropy=True)``: ``loss_fn(logp, entropy)``
LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


class TrainingEngine(Component):
    """Holds the trainable policy and its optimizer.

    Capabilities (class attributes, read by the run's assembly; never probed):

    - ``data_parallel``: trains one model across the processes of a launcher (each rank passes its share of a
      minibatch to :meth:`train_step`; gradients are averaged over ranks). Otherwise the engine is one process.
    - ``collective_weights``: :meth:`named_weights` is a collective (ZeRO-3, expert parallelism): every rank
      must call it, although only rank 0's rollout engine receives the weights, and consume it to the end in
      lockstep (ZeRO-3 gathers one layer per step of the iterator, :mod:`rlzoo.engines.deepspeed.layerwise`).
    - ``trains_values``: can be started with ``EngineContext.head = "value"`` to train a critic: :meth:`values`
      then gives the per-token values and :meth:`train_step`'s ``loss_fn`` receives values instead of log-probs.
    - ``trains_adapters``: can be started with ``EngineContext.lora`` (``model.lora``) to train LoRA adapters only:
      :meth:`named_weights` then gives the merged weights, :meth:`adapter` the adapters, :meth:`without_adapters`
      the base policy (the KL reference), and :meth:`save` writes the adapters as a peft folder.
    - ``computes_token_stats``: :meth:`token_stats` gives any registered per-token statistic of the policy
      (:mod:`rlzoo.interfaces.token_stats`; e.g. the optimal token baseline's).
    - ``computes_gradients``: :meth:`gradients` differentiates losses without a step (``rlzoo mismatch``'s
      gradients), unless :meth:`gradients_unavailable` says the engine's set-up rules it out.
    """

    kind = "training_engine"
    data_parallel: ClassVar[bool] = False
    collective_weights: ClassVar[bool] = False
    trains_values: ClassVar[bool] = False
    trains_adapters: ClassVar[bool] = False
    computes_token_stats: ClassVar[bool] = False
    computes_gradients: ClassVar[bool] = False

    def start(self, context: EngineContext, trainer_config: Any) -> None:
        raise NotImplementedError

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, T]`` log-probs of the response tokens, without gradient."""
        raise NotImplementedError

    def values(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, T]`` values of the state before each response token, without gradient (started with
        ``head="value"``)."""
        raise NotImplementedError(f"training engine {self.name!r} cannot train a critic (trains_values is False)")

    def logprobs_and_entropy(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, T]`` log-probs of the response tokens and ``[B, T]`` entropies of the full next-token distribution
        at each response position (0 where masked), without gradient, from the same forwards and without a
        ``[B, T, vocab]`` logits tensor (:func:`rlzoo.engines.tokens.hidden_logprobs`)."""
        raise NotImplementedError(f"training engine {self.name!r} cannot compute the policy's entropy")

    def token_stats(self, batch: TokenBatch, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """``[B, T]`` each named statistic (:mod:`rlzoo.interfaces.token_stats`) of the next-token distribution
        at each response position (0 where masked), without gradient or a ``[B, T, vocab]`` tensor."""
        raise NotImplementedError(f"training engine {self.name!r} cannot compute token statistics ({', '.join(names)})")

    def train_step(self, batch: TokenBatch, loss_fn: LossFn, with_entropy: bool = False) -> dict[str, float]:
        """One optimizer step on ``batch``: ``loss_fn(logp) -> (loss, metrics)`` (``loss_fn(logp, entropy)`` with
        ``with_entropy``, the entropy with gradient) sees the log-probs of the whole batch, and the step follows the
        gradient of that loss, however the engine cuts the batch into forwards (the in-process engines: micro-batches
        under ``trainer.max_tokens_per_micro_batch``, :mod:`rlzoo.engines.module_engine`). A non-finite loss or
        gradient skips the update and reports ``train/nonfinite_steps = 1``. Its metrics (``loss_fn``'s, its own) are
        floats or 0-dim tensors left on the device, read once a step (:func:`rlzoo.util.reductions.read_metrics`)."""
        raise NotImplementedError

    def gradients_unavailable(self) -> str | None:
        """Why :meth:`gradients` cannot run as this engine is set up (``None``: it can); asked after :meth:`start`."""
        return None if self.computes_gradients else f"training engine {self.name!r} computes no gradient without a step"

    def gradients(self, batch: TokenBatch, request: GradientRequest) -> list[torch.Tensor]:
        """Each loss of ``request`` differentiated at the current weights over ``batch`` and projected: one tensor per
        loss. No step; weights, optimizer and ``.grad`` are left as they were; the MoE balance term is no part of it."""
        raise NotImplementedError(self.gradients_unavailable())

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The current weights under Hugging Face names (what rollout engines load)."""
        raise NotImplementedError

    def save(self, directory: Path) -> None:
        """Write a loadable HF model folder (under LoRA: a peft adapter folder, ``PeftModel.from_pretrained``) plus
        optimizer state (no pickle) into ``directory``."""
        raise NotImplementedError

    def adapter(self, version: int = 0) -> Adapter:
        """The current LoRA adapters (started with ``EngineContext.lora``); a collective where :meth:`named_weights`
        is one."""
        raise NotImplementedError(
            f"training engine {self.name!r} cannot train LoRA adapters (trains_adapters is False)"
        )

    def adapter_targets_supported(self, fused_parameters: list[str]) -> str | None:
        """Why this engine (with its parameters) cannot train adapters on the model's fused expert parameters
        ``fused_parameters`` (``model.lora.target_modules`` entries such as ``experts.gate_up_proj``), or ``None``.
        Asked before :meth:`start`."""
        return None

    def without_adapters(self) -> Any:
        """The base policy without its adapters, sharing this engine's weights: an object with :meth:`logprobs` and
        :meth:`logprobs_and_entropy` (what the KL reference's learner calls)."""
        raise NotImplementedError(
            f"training engine {self.name!r} cannot train LoRA adapters (trains_adapters is False)"
        )

    def load_state(self, directory: Path) -> None:
        raise NotImplementedError

    def weights_finite(self) -> bool:
        """Whether every weight this engine trains is finite (no NaN, no infinity), the same answer on every rank
        (each checks what it holds, the answers combined). Asked before each checkpoint, which is not written when
        this is ``False`` (docs/faults.md). The default reads :meth:`named_weights` (a collective where that is one;
        every rank then sees the whole weights); :class:`~rlzoo.engines.module_engine.ModuleTrainingEngine` checks
        its parameters in place."""
        return all(bool(torch.isfinite(t).all()) for _, t in self.named_weights() if t.is_floating_point())

    #: processes this engine trains across, known after :meth:`start` (1 unless ``data_parallel``)
    world_size: int = 1

    # -- what the core does to the policy (implemented once for in-process torch modules: ModuleTrainingEngine) --

    def moe_layout(self) -> Layout | None:
        """The policy's mixture-of-experts layout (MoE layer indices, experts, top-k), ``None`` for a dense policy.
        Asked once after :meth:`start`; an MoE policy gets the router policy's Routing Replay."""
        raise NotImplementedError(f"training engine {self.name!r} does not say whether its policy is MoE")

    def routing_pass(self, replay: Routing | None = None) -> AbstractContextManager[RoutingPass]:
        """Around this process's forward passes of one batch (any of :meth:`logprobs`, :meth:`logprobs_and_entropy`,
        :meth:`train_step`): replay ``replay`` (a :class:`rlzoo.moe.Routing` of the rows this process runs, in
        their order; its layers only, the others route afresh) and record the experts every MoE layer used. On
        exit the yielded :class:`RoutingPass` holds them. Only for an MoE policy (:meth:`moe_layout`)."""
        raise NotImplementedError(f"training engine {self.name!r} cannot record or replay MoE routing")

    def copy_weights(self, into: Any = None) -> Any:
        """A copy of the current weights, opaque to the core (written into ``into``, an earlier copy, if given);
        with :meth:`exchange_weights` and :meth:`restore_weights`, what ``rollout.overlap: 1`` needs to run the
        old-log-prob pass under the weights that sampled a batch."""
        raise NotImplementedError(f"training engine {self.name!r} cannot copy its weights (rollout.overlap: 1)")

    def exchange_weights(self, copy: Any) -> None:
        """Swap the current weights with ``copy`` (from :meth:`copy_weights`): afterwards the engine runs with
        ``copy``'s weights and ``copy`` holds the previous ones."""
        raise NotImplementedError(f"training engine {self.name!r} cannot exchange its weights (rollout.overlap: 1)")

    def restore_weights(self, copy: Any) -> None:
        """Load ``copy`` (from :meth:`copy_weights`) into the engine's weights."""
        raise NotImplementedError(f"training engine {self.name!r} cannot restore its weights (rollout.overlap: 1)")

    # -- what the start-up check and the run's set-up ask (before :meth:`start`) ---------------------------------

    def process_group_backend(self) -> str:
        """The torch.distributed backend a multi-process run initialises: ``auto`` (nccl with CUDA, else gloo),
        ``gloo`` or ``nccl``."""
        return "auto"

    def memory_layout(self) -> TrainingLayout:
        """How this engine holds the training state on each rank (:mod:`rlzoo.models.memory`); the base keeps
        the whole state on every rank."""
        return TrainingLayout()

    def memory_hint(self, run: RunFacts) -> str:
        """What shrinks this engine's weights, gradients and optimizer state, for a run that does not fit."""
        partitioning = run.names("training_engine", lambda cls: cls.data_parallel)
        engines = " or ".join(f"{{name: {name}}}" for name in partitioning) or "a data-parallel engine"
        return f"trainer.engine: {engines} partitioning them over more processes ({self.name!r} keeps them whole)"


@dataclass
class RoutingPass:
    """What :meth:`TrainingEngine.routing_pass` yields; filled when its block ends.

    routing: the experts every MoE layer used (replayed ones included), a :class:`rlzoo.moe.Routing` of the rows
             this process ran, in their order.
    fresh:   what the current routers chose themselves in the replayed layers (``routing`` when nothing was
             replayed): the drift Routing Replay removed (``moe/fresh_flip_rate``).
    """

    routing: Routing | None = None
    fresh: Routing | None = None
