"""The ``weighted`` verifier: a weighted sum of other verifiers' rewards, each of which is also a named reward part."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

import rlzoo
from rlzoo.errors import ConfigError, RegistryError, RlzooError
from rlzoo.interfaces import Params, Problem, RunFacts, Sample, Verdict, Verifier


def part_labels(parts: list[dict[str, Any]]) -> list[str]:
    """Each part's reward-part name: its ``label``, else its verifier's name, suffixed ``_<index>`` when another
    part names the same verifier or label (so that two ``regex`` parts are ``regex_0`` and ``regex_1``)."""
    explicit = [part.get("label") for part in parts]
    taken = [label for label in explicit if label is not None]
    names = [part.get("name") for part in parts]
    out = []
    for index, (label, name) in enumerate(zip(explicit, names, strict=True)):
        if label is None:
            label = name if names.count(name) == 1 and name not in taken else f"{name}_{index}"
        out.append(str(label))
    return out


def _error(loc: tuple[str | int, ...], message: str, value: Any) -> InitErrorDetails:
    """A validation error at ``loc`` (below the field validated) whose message is ``message`` as it is."""
    error = PydanticCustomError("verifier_part", "{message}", {"message": message})
    return InitErrorDetails(type=error, loc=loc, input=value)


@rlzoo.register("verifier", "weighted")
class WeightedVerifier(Verifier):
    """A weighted sum of several verifiers' rewards: reward = sum_i weight_i * reward_i (e.g. math + a reward model).

    ``verifiers`` lists the parts, each ``{name: <verifier>, weight: <float, default 1.0>, ...its parameters}``;
    each part is validated and built through the registry, so an unknown name or parameter is reported at its
    field (``verifier.verifiers.1.name``), and each part's own preflight rules are checked at
    ``verifier.verifiers.<i>``. A batch is scored by each part's ``verify_batch`` in turn (if one raises, the
    scoring falls back to one response at a time, and a response a part cannot score gets 0 as a whole; so does
    one whose place in a part's ``verify_batch`` holds an error, a service part's failure, without re-scoring).
    The run folder is handed to every part (a service part keeps its reply cache there).

    Each part's unweighted reward is also a named reward part of the verdict (:attr:`Verdict.parts`), named by the
    part's ``label`` (default: its verifier's name, or ``<name>_<index>`` when two parts share it), for an advantage
    that normalises parts one by one (``gdpo``) and the ``reward/parts/<label>_mean`` metrics; a part's own reward
    parts (a nested ``weighted``) are not carried, its reward is.

    ``correct`` is true when every deciding part says correct: the parts listed in ``correct_from`` (indices into
    ``verifiers``), or by default every part that judges correctness (``judges_correctness()``: all but a
    ``reward-model`` without a threshold); never, when no part decides. Only outcome rewards are combined (a
    part's ``step_rewards`` are dropped); the parts' reasons are joined, each prefixed with the part's name. The
    parts' phase metrics (``time/reward_model``, ...) are passed on.
    """

    formula = (
        "reward = sum_i weight_i * reward_i; parts = {label_i: reward_i}; correct = all(correct_i, deciding parts)"
    )

    class Params(Params):
        verifiers: list[dict[str, Any]] = Field(
            min_length=1,
            description="the parts: {name: <verifier>, weight: 1.0, label: <reward part name>, ...its parameters}",
        )
        correct_from: list[int] | None = Field(
            None, description="indices of the parts whose correctness decides; null: every part that judges it"
        )

        @field_validator("verifiers")
        @classmethod
        def _parts(cls, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
            """Each part's name and parameters validated by the registry; the result holds every parameter."""
            registry = rlzoo.default_registry()
            errors, out = [], []
            for index, part in enumerate(parts):
                part = dict(part)
                name, weight, label = part.pop("name", None), part.pop("weight", 1.0), part.pop("label", None)
                if not isinstance(name, str):
                    message = "each part names a verifier: {name: <verifier>, weight: ..., ...its parameters}"
                    errors.append(_error((index, "name"), message, name))
                    continue
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                    errors.append(_error((index, "weight"), "a part's weight is a finite number", weight))
                    continue
                if label is not None and not (isinstance(label, str) and label.strip() and "/" not in label):
                    errors.append(_error((index, "label"), "a part's label is a non-empty name without '/'", label))
                    continue
                try:
                    params = registry.validate_params("verifier", name, part)
                except RegistryError as err:  # an unknown name, or one registered twice
                    errors.append(_error((index, "name"), str(err), name))
                    continue
                except ConfigError as err:  # its parameters, at their own (dotted) fields
                    for loc, message in err.problems:
                        errors.append(_error((index, *[f for f in loc.split(".") if f]), message, part))
                    continue
                labelled = {"label": label} if label is not None else {}  # left out unless given: as before labels
                out.append({"name": name, "weight": float(weight), **labelled, **params.model_dump()})
            if not errors:
                labels = part_labels(out)
                for index, label in enumerate(labels):
                    if labels.count(label) > 1 and "label" in out[index]:
                        message = f"two parts are labelled {label!r}: give each part its own label"
                        errors.append(_error((index, "label"), message, label))
            if errors:
                raise ValidationError.from_exception_data("weighted verifier parts", errors)
            return out

        @field_validator("correct_from")
        @classmethod
        def _deciders(cls, indices: list[int] | None, info: ValidationInfo) -> list[int] | None:
            parts = info.data.get("verifiers")
            if indices is None or parts is None:
                return indices
            errors = [
                _error((k,), f"{index} is not a part's index: verifiers has {len(parts)}, 0 to {len(parts) - 1}", index)
                for k, index in enumerate(indices)
                if not 0 <= index < len(parts)
            ]
            if errors:
                raise ValidationError.from_exception_data("weighted verifier correct_from", errors)
            return indices

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        registry = rlzoo.default_registry()
        self.parts: list[Verifier] = []
        self.weights: list[float] = []
        self.labels = part_labels(self.params.verifiers)
        for index, spec in enumerate(self.params.verifiers):
            spec = dict(spec)
            name, weight = spec.pop("name"), spec.pop("weight")
            spec.pop("label", None)
            try:
                self.parts.append(registry.create("verifier", name, spec, loc=f"verifiers.{index}"))
            except ConfigError as err:
                raise RlzooError("; ".join(f"{loc}: {message}" for loc, message in err.problems)) from err
            self.weights.append(weight)
        if self.params.correct_from is not None:
            self.deciders = list(self.params.correct_from)
        else:
            self.deciders = [i for i, part in enumerate(self.parts) if part.judges_correctness()]

    def judges_correctness(self) -> bool:
        return bool(self.deciders)

    def reward_parts(self) -> tuple[str, ...]:
        return tuple(self.labels)

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """Each part's own rules at ``<at>.verifiers.<i>``; a part in ``correct_from`` must judge correctness."""
        problems = list(super().preflight(run, at))
        for index, part in enumerate(self.parts):
            problems += part.preflight(run, f"{at}.verifiers.{index}")
        for k, index in enumerate(self.params.correct_from or []):
            if not self.parts[index].judges_correctness():
                problems.append(
                    (
                        f"{at}.correct_from.{k}",
                        (
                            f"part {index} ({self.parts[index].name}) does not judge correctness (its verdicts are never "
                            "correct; a reward-model needs a threshold): name parts that do, or null"
                        ),
                    )
                )
        return problems

    def verify(self, sample: Sample, response: str) -> Verdict:
        return self._combine([[part.verify(sample, response)] for part in self.parts])[0]

    def verify_batch(self, samples: list[Sample], responses: list[str]) -> list[Verdict | Exception]:
        per_part = []
        for part in self.parts:
            verdicts = part.verify_batch(samples, responses)
            if len(verdicts) != len(responses):
                raise ValueError(f"part {part.name} returned {len(verdicts)} verdicts for {len(responses)} responses")
            per_part.append(verdicts)
        return self._combine(per_part)

    def use_run_folder(self, run_dir: Path) -> None:
        for part in self.parts:  # a service part keeps its reply cache there
            part.use_run_folder(run_dir)

    def _combine(self, per_part: list[list[Verdict | Exception]]) -> list[Verdict | Exception]:
        out: list[Verdict | Exception] = []
        for verdicts in zip(*per_part, strict=True):
            failed = next((v for v in verdicts if isinstance(v, Exception)), None)
            if failed is not None:  # a part could not score it (a service): the response is unscored as a whole
                out.append(failed)
                continue
            reward = sum(w * float(v.reward) for w, v in zip(self.weights, verdicts, strict=True))
            reasons = [f"{part.name}: {v.reason}" for part, v in zip(self.parts, verdicts, strict=True) if v.reason]
            correct = bool(self.deciders) and all(bool(verdicts[i].correct) for i in self.deciders)
            parts = {label: float(v.reward) for label, v in zip(self.labels, verdicts, strict=True)}
            out.append(Verdict(reward=reward, reason="; ".join(reasons) or None, correct=correct, parts=parts))
        return out

    def take_phase_metrics(self) -> dict[str, float]:
        for part in self.parts:
            for key, value in part.take_phase_metrics().items():
                self.record_phase(key, value)
        return super().take_phase_metrics()
