"""The ``reward-model`` verifier: a Hugging Face sequence-classification model's score of the conversation."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

import rlzoo
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Params, Problem, RunFacts, Sample, Verdict, Verifier
from rlzoo.util.reductions import Max

if TYPE_CHECKING:
    import torch

GB = 10**9  # decimal gigabytes, as rlzoo's memory estimate prints them
HEAD_SUFFIX = "ForSequenceClassification"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@rlzoo.register("verifier", "reward-model")
class RewardModelVerifier(Verifier):
    """A sequence-classification reward model's score of the conversation, as the reward: scale * score + shift.

    The model (``path``: a Hugging Face ``...ForSequenceClassification`` folder with one label, and its tokenizer)
    loads on the first scoring, once, in eval mode on ``device``. Each response is rendered with the reward
    model's chat template as ``[user: prompt, assistant: response]`` (a sample's chat ``messages`` in place of
    the user turn; a tokenizer without a chat template gets ``prompt + response`` as plain text), cut to its last
    ``max_tokens`` tokens, and scored in batches of ``batch_size`` without gradients, right-padded with the
    model's ``pad_token_id`` (causal attention never sees the padding, so a batch scores as each response alone;
    transformers reads the logit of the last token that is not padding). ``score`` is that single logit:

        reward = scale * score + shift;  correct = score >= threshold  (threshold null: never correct)

    With ``threshold: null`` the verifier does not judge correctness (``judges_correctness()`` is false), so
    ``reward/correct_fraction`` and ``eval/accuracy`` are 0; combine it with a correctness verifier in ``weighted``
    or set a threshold. Phase metrics (:meth:`rlzoo.interfaces.Verifier.record_phase`): ``time/reward_model``
    (seconds of rendering and forward passes, a ``Sum``), ``time/reward_model_load`` (with the scoring that loads
    the model), ``memory/reward_model_weights_gb`` (the loaded weights' bytes / 1e9 on their device, a ``Max``)
    and, on CUDA, ``memory/reward_model_peak_gb`` (CUDA's peak allocated memory of the device during the scoring,
    everything on it included; the peak statistic is reset before each scoring).
    """

    formula = "reward = scale * RM(chat_template([user: prompt, assistant: response])) + shift"
    reference = "Ouyang et al. 2022, InstructGPT (arXiv:2203.02155): a learned reward model as the RL reward"
    trl_name = "reward_funcs (a sequence-classification model)"
    verl_name = "reward_model"

    class Params(Params):
        path: str = Field(
            description="a Hugging Face sequence-classification model folder (one label), tokenizer included"
        )
        scale: float = Field(1.0, allow_inf_nan=False, description="reward = scale * score + shift")
        shift: float = Field(0.0, allow_inf_nan=False, description="reward = scale * score + shift")
        threshold: float | None = Field(
            None, allow_inf_nan=False, description="correct when score >= threshold; null: correctness is not judged"
        )
        batch_size: int = Field(16, ge=1, description="responses per forward pass")
        max_tokens: int | None = Field(
            None, ge=1, description="keep the last max_tokens tokens of a conversation; null: the model's context"
        )
        dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
            "auto", description="weights' dtype; auto: bfloat16 on CUDA, float32 on the CPU"
        )
        device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: the current CUDA device if any")

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._device: torch.device | None = None
        self._max_tokens: int | None = None
        self._weight_bytes = 0
        self._load_error: str | None = None

    def judges_correctness(self) -> bool:
        return self.params.threshold is not None

    # -- checks ------------------------------------------------------------------------------------------------

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """The folder is a one-label sequence-classification model with weights and a tokenizer; ``max_tokens``
        fits its context; with a GPU memory check, its weights fit beside the run's estimate."""
        problems = list(super().preflight(run, at))
        problems += [(f"{at}.{field}", message) for field, message in folder_problems(self.params)]
        if problems or run.memory is None or run.device_memory is None or self.params.device == "cpu":
            return problems
        weights = weight_bytes(Path(self.params.path).expanduser(), self._dtype_name(cuda=True))
        total = run.memory.total(run.device_memory)
        if weights is not None and total <= run.device_memory < total + weights:
            problems.append(
                (
                    f"{at}.path",
                    (
                        f"the reward model's weights ({weights / GB:.2f} GB in {self._dtype_name(cuda=True)}) do not fit beside "
                        f"the run's estimated {total / GB:.1f} GB per rank in {run.device_memory / GB:.1f} GB: use a smaller "
                        f"reward model or dtype, or {at}.device: cpu"
                    ),
                )
            )
        return problems

    # -- scoring -----------------------------------------------------------------------------------------------

    def verify(self, sample: Sample, response: str) -> Verdict:
        return self.verify_batch([sample], [response])[0]

    def verify_batch(self, samples: list[Sample], responses: list[str]) -> list[Verdict]:
        scores = self.scores(samples, responses)
        p = self.params
        return [
            Verdict(
                reward=p.scale * s + p.shift,
                correct=p.threshold is not None and s >= p.threshold,
            )
            for s in scores
        ]

    def scores(self, samples: list[Sample], responses: list[str]) -> list[float]:
        """The model's raw score of each ``(sample, response)``: the single logit of its sequence-classification
        head, in batches of ``batch_size`` (responses of similar length together)."""
        import torch

        self._load()
        if not responses:
            return []
        cuda = self._device is not None and self._device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self._device)
        with self.timed_phase("reward_model"):
            encoded = [self._encode(s, r) for s, r in zip(samples, responses, strict=True)]
            order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
            out: list[float] = [0.0] * len(encoded)
            pad = self._model.config.pad_token_id
            size = self.params.batch_size
            with torch.inference_mode():
                for start in range(0, len(order), size):
                    rows = order[start : start + size]
                    width = max(len(encoded[i]) for i in rows)
                    ids = torch.full((len(rows), width), pad, dtype=torch.long)
                    mask = torch.zeros((len(rows), width), dtype=torch.long)
                    for row, i in enumerate(rows):
                        ids[row, : len(encoded[i])] = torch.tensor(encoded[i], dtype=torch.long)
                        mask[row, : len(encoded[i])] = 1
                    logits = self._model(input_ids=ids.to(self._device), attention_mask=mask.to(self._device)).logits
                    for i, value in zip(rows, logits[:, 0].float().tolist(), strict=True):
                        out[i] = value
        self.record_phase("memory/reward_model_weights_gb", Max(self._weight_bytes / GB))
        if cuda:
            self.record_phase("memory/reward_model_peak_gb", Max(torch.cuda.max_memory_allocated(self._device) / GB))
        return out

    def render(self, sample: Sample, response: str) -> str:
        """The text the model scores: the chat template's conversation, or ``prompt + response`` without one."""
        self._load()
        return self._render(sample, response)

    def encode(self, sample: Sample, response: str) -> list[int]:
        """The token ids the model scores: :meth:`render`'s text encoded, its last ``max_tokens`` kept."""
        self._load()
        return self._encode(sample, response)

    def _render(self, sample: Sample, response: str) -> str:
        tokenizer = self._tokenizer
        if not tokenizer.chat_template:
            return sample.prompt + response
        user = sample.messages if sample.messages is not None else [{"role": "user", "content": sample.prompt}]
        return tokenizer.apply_chat_template([*user, {"role": "assistant", "content": response}], tokenize=False)

    def _encode(self, sample: Sample, response: str) -> list[int]:
        text = self._render(sample, response)
        # a chat template writes its special tokens itself; plain text gets the tokenizer's own (a BOS, if any)
        ids = self._tokenizer(text, add_special_tokens=not self._tokenizer.chat_template)["input_ids"]
        if not ids:
            raise ValueError("the rendered conversation has no tokens")
        return ids[-self._max_tokens :] if self._max_tokens is not None else ids

    # -- loading -----------------------------------------------------------------------------------------------

    def _dtype_name(self, cuda: bool) -> str:
        return self.params.dtype if self.params.dtype != "auto" else ("bfloat16" if cuda else "float32")

    def _load(self) -> None:
        """Load the model once (thread-safe); a failure is raised again, without retrying, on every later call."""
        with self._lock:
            if self._model is not None:
                return
            if self._load_error is not None:
                raise RlzooError(self._load_error)
            try:
                with self.timed_phase("reward_model_load"):
                    self._load_model()
            except Exception as exc:
                reason = str(exc) if isinstance(exc, RlzooError) else f"{type(exc).__name__}: {exc}"
                self._load_error = f"reward model {self.params.path} failed to load: {reason}"
                raise RlzooError(self._load_error) from exc

    def _load_model(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        problems = folder_problems(self.params)
        if problems:
            raise RlzooError("; ".join(f"{field}: {message}" for field, message in problems))
        path = Path(self.params.path).expanduser()
        if self.params.device == "cuda" or (self.params.device == "auto" and torch.cuda.is_available()):
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        dtype = getattr(torch, self._dtype_name(device.type == "cuda"))
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
        if model.config.pad_token_id is None:  # needed to batch: transformers finds each row's last real token by it
            if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
                raise RlzooError("neither the model's config nor its tokenizer names a pad or end-of-sequence token")
            pad = tokenizer.pad_token_id
            model.config.pad_token_id = pad if pad is not None else tokenizer.eos_token_id
        model.to(device).eval()
        self._max_tokens = self.params.max_tokens or getattr(model.config, "max_position_embeddings", None)
        self._weight_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
        self._tokenizer, self._device, self._model = tokenizer, device, model


def folder_problems(params: RewardModelVerifier.Params) -> list[tuple[str, str]]:
    """``(parameter, message)`` for what makes ``params.path`` unusable as a reward model: read from its files'
    metadata (``config.json``, file names; :meth:`rlzoo.interfaces.RunFacts.model_folder`, the policy's check),
    nothing loaded."""
    path = Path(params.path).expanduser()
    expected = f"a Hugging Face sequence-classification model folder (config.json naming a ...{HEAD_SUFFIX}, weights, tokenizer)"
    folder = RunFacts.model_folder(path)
    if folder.absent is not None:
        return [("path", f"{path} {folder.absent}; expected {expected}")]
    config = folder.config
    if config is None:
        return [("path", str(folder.unreadable))]
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if not any(a.endswith(HEAD_SUFFIX) for a in architectures):
        what = (
            f"a {', '.join(architectures)} folder"
            if architectures
            else "a folder whose config.json names no model class"
        )
        return [
            (
                "path",
                (
                    f"{path} is {what}, not a sequence-classification model (...{HEAD_SUFFIX}); a reward model has a "
                    f"one-score head: save one with AutoModelForSequenceClassification (num_labels=1)"
                ),
            )
        ]
    problems = []
    labels = config.get("id2label")
    count = len(labels) if isinstance(labels, dict) else config.get("num_labels", 2)  # transformers' default: 2
    if count != 1:
        problems.append(
            (
                "path",
                (
                    f"{path} has {count} labels (config.json id2label); the reward-model verifier reads one score: use a "
                    "model saved with num_labels=1"
                ),
            )
        )
    problems += [
        ("path", message)
        for message in folder.problems(tokenizer=": save the reward model's tokenizer into it", head="score")
    ]
    context = config.get("max_position_embeddings")
    if params.max_tokens is not None and isinstance(context, int) and params.max_tokens > context:
        problems.append(
            (
                "max_tokens",
                f"{params.max_tokens} exceeds the reward model's context ({context} positions, "
                "config.json max_position_embeddings); use at most that, or null",
            )
        )
    return problems


def weight_bytes(path: Path, dtype: str) -> int | None:
    """The bytes of the folder's weights in ``dtype``: each tensor's shape and dtype from the safetensors headers
    (no tensor is read), floating-point tensors cast to ``dtype``; ``None`` without readable safetensors files."""
    from safetensors import SafetensorError, safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                slices = [weights.get_slice(name) for name in weights.keys()]
                entries = [(math.prod(s.get_shape()), s.get_dtype()) for s in slices]
        except (OSError, SafetensorError):
            return None
        for count, kind in entries:
            floating = kind.startswith(("F", "BF"))
            total += count * (DTYPE_BYTES[dtype] if floating else SAFETENSORS_BYTES.get(kind, 4))
    return total
