"""Which correction pays, in gradients: the policy-gradient estimate under each correction against the on-policy one.

Each measured batch's rows are cut into the config's minibatches exactly as a step cuts them
(:func:`rlzoo.rl.loop.minibatches`, the step's shuffle seed): each minibatch ``b`` is the sample one optimizer step
follows. On each, at the measured weights (no step is taken), with ``L`` the config's objective on the minibatch
(its ratio, clipper, aggregation, KL term and regularisers, :func:`rlzoo.rl.loop.minibatch_loss`)::

    g*_b   = grad L(old = log pi_train,  weights = rho_i,  mask)                        the on-policy reference
    g_c,b  = grad L(old = the config's old log-probs,  weights = w_c,  mask * keep_c)   correction c, as the loop
             applies it (old_logprobs: train -> log pi_train; rollout / rollout-only -> log pi_rollout)

    rho_i  = exp(sum_t m_t (log pi_train(y_t) - log pi_rollout(y_t)))     response i's exact importance weight
             (its log clamped to +-20, as verl does)

The responses were sampled by the rollout engine, so ``E[rho_i f(y_i)] = E_{y ~ pi_train}[f(y)]``: ``g*`` estimates
without bias the gradient the step would follow had the training engine sampled them itself (the ratio is 1 at the
measured weights: no mismatch). Without ``rho``, with ``old_logprobs: train`` ``g_none`` would equal ``g*`` by
construction, and ignoring the mismatch would show no bias. ``w_c`` and ``keep_c`` are the correction's weights and
kept tokens from the same log-probs and advantages (:mod:`rlzoo.mismatch.corrections`).

What is compared: the gradient of every trained parameter (the adapters under LoRA), projected to :data:`SKETCH_DIM`
numbers by a CountSketch with a fixed seed (Charikar, Chen & Farach-Colton 2002): coordinate ``j`` of parameter
``p`` adds ``s_p(j) g_j`` to bucket ``h_p(j)``, with ``h_p(x) = ((a x + b) mod P) mod D`` and
``s_p(x) = 2 (((c x + e) mod P) mod 2) - 1`` (``P = 2^31 - 1``; ``a, b, c, e`` drawn per parameter from the seed).
The map is linear and ``<S x, S y>`` is an unbiased estimate of ``<x, y>`` (relative error about ``sqrt(2 / D)``,
0.6% at ``D = 65536``), so every number below is the full gradient's up to that error, at any model size.

Over the ``B`` minibatches of all measured batches (``mean`` over ``b``; ``G = ||mean g*_b||``)::

    bias     = || mean g_c,b - mean g*_b || / G                                relative bias of the estimate
    bias_noise = sqrt(sum_b || D_b - mean D_b ||^2 / (B (B - 1))) / G,        what sampling alone puts in ``bias``
                 D_b = g_c,b - g*_b                                            (its standard error: a bias near it
                                                                               is within the batch's noise)
    grad_var = sum_b || g_c,b - mean g_c,b ||^2 / (B - 1) / G^2               variance of one step's gradient
    cosine   = < mean g_c,b, mean g*_b > / (|| mean g_c,b || G)
    mse      = bias^2 + grad_var / H                                           relative mean squared error, against
                                                                               g*, of the run's mean gradient

with ``H`` the run's optimizer steps (``train.steps x algorithm.minibatches_per_rollout``): if every step's gradient
carries this bias and its own independent noise, the mean of ``H`` of them is off by ``bias^2 + grad_var / H``; the
bias does not average out over a run, the noise does (``H = 1``: one step's error). The reference itself has bias 0
and cosine 1; its own ``grad_var`` says how noisy a step's gradient is anyway.
``grad_var`` needs ``B >= 2`` (NaN otherwise), every number ``G > 0`` (a batch whose advantages are all 0, and no
KL or regulariser term, has no gradient: NaN).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

import torch

from rlzoo.config.schema import RunConfig
from rlzoo.engines import GradientRequest
from rlzoo.interfaces import MismatchCorrection
from rlzoo.interfaces.base import collecting
from rlzoo.mismatch.measures import MAX_LOG_RATIO
from rlzoo.rl import loop
from rlzoo.rl.loss_inputs import LossInputs
from rlzoo.rl.step_record import StepRecord, filled
from rlzoo.util.seeds import Stream, step_seed

REFERENCE = "on-policy"  # the reference estimator's name beside the corrections'
SKETCH_DIM = 2**16
_PRIME = 2**31 - 1  # the hashes' modulus (a Mersenne prime above any parameter's coordinate count here)
CACHED_COORDINATES = 2**26  # the sketch keeps this many coordinates' hashes (335 MB), recomputes the others


class CountSketch:
    """``S``: the trained parameters' gradients (in the engine's order) to ``dim`` numbers (module docstring); the
    same map at every call, on the gradients' device. Each parameter's hashes are computed once and kept while they
    fit in :data:`CACHED_COORDINATES` (5 bytes a coordinate), else recomputed at each call."""

    def __init__(self, seed: int, dim: int = SKETCH_DIM) -> None:
        self.seed, self.dim = seed, dim
        self.parameters = 0  # coordinates sketched by the last call (the trained parameters' count)
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._cached = 0

    def hashes(self, index: int, count: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Bucket ``[count]`` (int32) and sign ``[count]`` (int8, +-1) of each coordinate of parameter ``index``."""
        if index in self._cache:
            return self._cache[index]
        rng = random.Random(self.seed * 1_000_003 + index)
        a, b, c, e = (rng.randrange(1, _PRIME) for _ in range(4))
        x = torch.arange(count, device=device, dtype=torch.int64)
        hashed = ((x * a + b) % _PRIME % self.dim).int(), ((x * c + e) % _PRIME % 2 * 2 - 1).to(torch.int8)
        if self._cached + count <= CACHED_COORDINATES:
            self._cache[index], self._cached = hashed, self._cached + count
        return hashed

    def __call__(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
        out, self.parameters = None, 0
        for index, grad in enumerate(grads):
            if grad is None:
                continue
            flat = grad.detach().reshape(-1).float()
            bucket, sign = self.hashes(index, flat.numel(), flat.device)
            out = torch.zeros(self.dim, device=flat.device) if out is None else out
            out.index_add_(0, bucket, flat * sign)
            self.parameters += flat.numel()
        return out if out is not None else torch.zeros(self.dim)


def exact_weights(train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``rho_i`` of every response (module docstring), broadcast over its ``[B, T]`` tokens."""
    log_rho = torch.where(mask > 0, train.double() - rollout.double(), 0.0).sum(-1, keepdim=True)
    return torch.exp(log_rho.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)).expand_as(mask).to(train.dtype)


def estimators(
    record: StepRecord, config: RunConfig, corrections: Mapping[str, MismatchCorrection]
) -> dict[str, LossInputs]:
    """The loss inputs of :data:`REFERENCE` and of each correction (by name) on the record's batch."""
    old, mask = filled(record.old, "old"), filled(record.batch, "batch").response_mask
    advantages, train = filled(record.advantages, "advantages"), filled(old.train, "old.train")
    out = {REFERENCE: LossInputs(train, advantages, mask, old.reference, exact_weights(train, old.rollout, mask))}
    own_old = train if config.algorithm.old_logprobs == "train" else old.rollout
    with collecting():  # what the corrections report belongs to a step's metrics, not to this measurement
        for name in sorted(corrections):
            weights = corrections[name].weights(train, old.rollout, mask).detach()
            keep = corrections[name].keep(train, old.rollout, mask, advantages).detach()
            out[name] = LossInputs(own_old, advantages, mask * keep, old.reference, weights)
    return out


def batch_gradients(
    record: StepRecord, c: loop.Components, config: RunConfig, inputs: Mapping[str, LossInputs], sketch: CountSketch
) -> dict[str, list[torch.Tensor]]:
    """Per estimator (the keys of ``inputs``), the sketched gradient of each minibatch of the record's batch, cut and
    seeded as :func:`rlzoo.rl.loop.minibatch_updates` cuts and seeds them; the learner's router policy replays what
    an update would."""
    batch = filled(record.batch, "batch")
    shuffle = step_seed(config.seed, record.step, Stream.SHUFFLE)
    count, number = len(batch.response_mask), config.algorithm.minibatches_per_rollout
    same = _representatives(inputs)  # estimators with equal inputs (a correction that changes nothing) share one
    distinct = list(dict.fromkeys(same.values()))
    out: dict[str, list[torch.Tensor]] = {name: [] for name in inputs}
    for index, rows in enumerate(loop.minibatches(count, number, shuffle)):
        seed = step_seed(config.seed, record.step, Stream.MINIBATCH_LOSS + index)
        losses = [loop.minibatch_loss(c.objective, inputs[name], rows, seed) for name in distinct]
        with collecting():  # the objective's reports: no step's
            grads = c.learner.gradients(batch, rows, GradientRequest(losses, sketch, c.objective.needs_entropy))
        by_name = dict(zip(distinct, grads, strict=True))
        for name in inputs:
            out[name].append(by_name[same[name]].detach().double().cpu())
    return out


def _representatives(inputs: Mapping[str, LossInputs]) -> dict[str, str]:
    """Each estimator's representative: the first (in ``inputs``' order) whose old log-probs, mask and weights equal
    its own (the advantages and reference are the same for all)."""
    out: dict[str, str] = {}
    for name, these in inputs.items():
        out[name] = next((r for r in dict.fromkeys(out.values()) if _equal(inputs[r], these)), name)
    return out


def _equal(a: LossInputs, b: LossInputs) -> bool:
    pairs = ((a.old_logp, b.old_logp), (a.mask, b.mask), (a.weights, b.weights))
    return all(x.dtype == y.dtype and torch.equal(x, y) for x, y in pairs)


class GradientMeasure:
    """Every measured batch's minibatch gradients under each estimator, sketched (:meth:`add`, batch after batch, all
    under the same weights); :meth:`effects` compares them, :meth:`about` says what they were measured on."""

    def __init__(self, corrections: Mapping[str, MismatchCorrection], seed: int, horizon: int) -> None:
        self.corrections, self.sketch, self.horizon = corrections, CountSketch(seed), horizon
        self.parts: dict[str, list[torch.Tensor]] = {}

    def add(self, record: StepRecord, c: loop.Components, config: RunConfig) -> None:
        inputs = estimators(record, config, self.corrections)
        for name, grads in batch_gradients(record, c, config, inputs, self.sketch).items():
            self.parts.setdefault(name, []).extend(grads)

    def effects(self) -> dict[str, dict[str, float]]:
        return gradient_effects(self.parts, self.horizon)

    def about(self) -> dict[str, object]:
        minibatches = len(self.parts.get(REFERENCE, []))
        sketch = self.sketch
        return {
            "minibatches": minibatches,
            "horizon": self.horizon,
            "parameters": sketch.parameters,
            "sketch_dim": sketch.dim,
            "sketch_seed": sketch.seed,
        }


def gradient_effects(vectors: Mapping[str, Sequence[torch.Tensor]], horizon: int = 1) -> dict[str, dict[str, float]]:
    """``bias``, ``bias_noise``, ``grad_var``, ``cosine`` and ``mse`` over ``horizon`` optimizer steps (module
    docstring) of every estimator in ``vectors`` (each a list of ``B`` sketched minibatch gradients, the same
    minibatches for all) against :data:`REFERENCE`'s."""
    reference_parts = torch.stack(list(vectors[REFERENCE]))  # [B, D]
    reference = reference_parts.mean(0)
    scale = reference.norm().item()
    out = {}
    for name, parts in vectors.items():
        g = torch.stack(list(parts))  # [B, D]
        mean, count = g.mean(0), len(g)
        if scale == 0:
            out[name] = dict.fromkeys(("bias", "bias_noise", "grad_var", "cosine", "mse"), math.nan)
            continue
        spread = (g - mean).square().sum().item() / (count - 1) if count > 1 else math.nan
        differences = g - reference_parts  # [B, D]: paired, minibatch by minibatch
        noise = (differences - differences.mean(0)).square().sum().item() / (count * (count - 1)) if count > 1 else 0.0
        bias = (mean - reference).norm().item() / scale
        norm = mean.norm().item()
        grad_var = spread / scale**2
        out[name] = {
            "bias": bias,
            "bias_noise": math.sqrt(noise) / scale if count > 1 else math.nan,
            "grad_var": grad_var,
            "cosine": (mean @ reference).item() / (norm * scale) if norm > 0 else math.nan,
            "mse": bias**2 + grad_var / horizon,
        }
    return out
