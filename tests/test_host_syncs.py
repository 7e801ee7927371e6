"""The hot path does not wait on the device once per minibatch: the objective's metrics stay tensors and a step
reads them all at once (:func:`rlzoo.util.reductions.read_metrics`), the loss's inputs are copied to the device once.

On a GPU every ``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ... of a device tensor makes the host wait for
the device. This machine has none, so the test counts those calls (:class:`HostReads`) where they would reach the
device: in the modules that compute the loss and its metrics, and in the training engines. What a step reads of
host-side tensors (the batch's layout, the micro-batch plan) is no wait and is not counted. With a GPU,
``torch.cuda.set_sync_debug_mode`` would flag the real ones (not run here).
"""

from __future__ import annotations

import collections
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import rlzoo
from rlzoo.config.schema import RunConfig, TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext, Generation, RolloutEngine
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.interfaces import Sample, Verdict, Verifier
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.registry import default_registry
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components, rl_step
from rlzoo.rl.objective import build_objective
from rlzoo.util.reductions import Deferred, Min, read_metrics, reduce_minibatches

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
#: where a GPU run's tensors are on the device: the loss, its metrics and inputs, the engines' passes and steps
HOT = [
    Path(rlzoo.__file__).parent / p
    for p in (
        "rl/objective.py",
        "rl/loss_inputs.py",
        "rl/critic.py",
        "util/reductions.py",
        "util/tensors.py",
        "engines/module_engine.py",
        "engines/torch_trainer.py",
        "engines/aux_loss.py",
        "engines/tokens.py",
    )
]
HOT += [  # the loss's components (an advantage source works on the CPU, before the updates)
    Path(where) / kind
    for where in importlib.util.find_spec("rlzoo_estimators").submodule_search_locations
    for kind in ("ratios", "clippers", "aggregations", "kl", "regularisers", "value_losses")
]
#: what the torch engine reads per optimizer step, to decide it: whether the loss is finite, the gradient norm
ENGINE_READS_PER_UPDATE = 2
#: what a step reads besides: the old pass's log-probs and entropies (one copy each), all the updates' metrics (one)
READS_PER_STEP = 3


class HostReads:
    """Counts the calls of :data:`READS` (and ``.to("cpu")``) on tensors made from code under :data:`HOT`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sites: collections.Counter[str] = collections.Counter()
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name), name))
        monkeypatch.setattr(torch.Tensor, "to", self._counting(torch.Tensor.to, "to", _to_cpu))

    @property
    def count(self) -> int:
        return sum(self.sites.values())

    def _counting(self, method, name, counts=lambda *a, **k: True):
        sites = self.sites

        def counted(tensor, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if counts(*args, **kwargs) and any(caller.startswith(str(hot)) for hot in HOT):
                sites[f"{Path(caller).name}:{sys._getframe(1).f_lineno} {name}"] += 1
            return method(tensor, *args, **kwargs)

        return counted


def _to_cpu(*args, **kwargs) -> bool:
    """A ``.to`` that copies to the CPU and waits for it (a non-blocking one is a copy to the device here)."""
    device = kwargs.get("device", args[0] if args else None)
    cpu = isinstance(device, str | torch.device) and torch.device(device).type == "cpu"
    return cpu and not kwargs.get("non_blocking", False)


class Sums(RolloutEngine):
    """Answers each prompt with tokens of its own vocabulary: right or wrong in turn, so the groups have a spread."""

    name = "sums"

    def __init__(self, tokenizer) -> None:
        super().__init__()
        self.tokenizer = tokenizer

    def generate(self, prompts, sampling):
        out = []
        for prompt in prompts:
            texts = ["3" if i % 2 else "12" for i in range(sampling.n)]
            ids = [self.tokenizer(t)["input_ids"] + [self.tokenizer.eos_token_id] for t in texts]
            out.append([Generation(list(prompt), r, [-1.0] * len(r), True) for r in ids])
        return out

    def sync_weights(self, named_tensors) -> None:
        for _ in named_tensors:  # what a real engine reads of them is the weight sync's, not the update's
            pass


class Exact(Verifier):
    name = "exact"

    def verify(self, sample: Sample, response: str) -> Verdict:
        return Verdict(float(response.strip() == sample.answer))


def _parts(tmp_path: Path, config: RunConfig) -> Components:
    """The loop's components around a real torch engine on a tiny dense model."""
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(hidden_size=32, intermediate_size=64, architecture="qwen3")
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, tmp_path / "m")
    engine = TorchTrainingEngine()
    context = EngineContext(tmp_path / "m", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    engine.start(context, TrainerConfig(lr=1e-3))
    algorithm, registry = config.algorithm, default_registry()
    return Components(
        objective=build_objective(algorithm),
        advantage=registry.create("advantage", algorithm.advantage.name, algorithm.advantage.params),
        verifier=Exact(),
        correction=registry.create("correction", "none"),
        rollout=Sums(tokenizer),
        learner=Learner(engine),
        tokenizer=tokenizer,
        train_set=TRAIN_SET,
    )


TRAIN_SET = [Sample(f"{a}+{b}=", str(a + b)) for a, b in [(1, 2), (5, 7), (2, 1), (3, 0)]]


def _config(minibatches: int) -> RunConfig:
    return RunConfig.model_validate(
        {
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 3},
            "algorithm": {"preset": "gspo", "minibatches_per_rollout": minibatches},
        }
    )


def _reads(step: int, parts: Components, config: RunConfig, monkeypatch: pytest.MonkeyPatch) -> HostReads:
    reads = HostReads(monkeypatch)
    metrics = rl_step(step, TRAIN_SET, parts, config)
    monkeypatch.undo()
    assert metrics["train/nonfinite_steps"] == 0.0 and type(metrics["ratio/min"]) is Min
    return reads


def test_a_steps_waits_on_the_device_do_not_grow_with_its_minibatches(tmp_path, monkeypatch):
    parts = _parts(tmp_path, _config(1))
    rl_step(0, TRAIN_SET, parts, _config(1))  # warms up: what is done once per run is not counted
    one, four = _reads(1, parts, _config(1), monkeypatch), _reads(2, parts, _config(4), monkeypatch)
    report = f"1 minibatch: {one.count} {dict(one.sites)}\n4 minibatches: {four.count} {dict(four.sites)}"
    assert four.count - one.count <= 3 * ENGINE_READS_PER_UPDATE, report
    assert one.count <= READS_PER_STEP + ENGINE_READS_PER_UPDATE, report


def test_the_objective_reads_nothing_and_a_step_reads_its_minibatches_metrics_at_once(monkeypatch):
    objective = build_objective({"preset": "dapo", "kl_coef": 0.1})
    logp = torch.tensor([[-1.0, -2.0, -0.3], [-0.5, -0.1, -0.7]], requires_grad=True)
    inputs = (logp.detach() - 0.1, torch.tensor([[1.0], [-1.0]]).expand(2, 3), torch.ones(2, 3), logp.detach() + 0.2)
    reads = HostReads(monkeypatch)
    parts = [objective.on_device(logp, *inputs)[1] for _ in range(4)]
    assert reads.count == 0, dict(reads.sites)
    reduced = reduce_minibatches(parts)
    assert reads.count == 1, dict(reads.sites)  # one .tolist() of every value of every part
    monkeypatch.undo()
    assert type(reduced["ratio/min"]) is Min and isinstance(parts[0]["ratio/min"], Deferred)
    _, floats = objective(logp, *inputs)  # the plain-tensor call: its metrics read as floats, each .item()'s value
    read = read_metrics(parts[:1])[0]
    assert read.keys() == floats.keys() and all(read[k] == floats[k] == parts[0][k].item() for k in _plain(floats))
    assert (read["ratio/min"], type(read["ratio/min"])) == (parts[0]["ratio/min"].value.item(), Min)


def _plain(metrics: dict) -> list[str]:
    return [k for k, v in metrics.items() if type(v) is float]
