"""``rlzoo check-verifier CONFIG PAIRS``: does the config's verifier prefer the better response of each pair?

Before hours of training against an LLM judge or a reward model, measure whether it tells a good response from a
bad one. The measure is RewardBench's pairwise accuracy (Lambert et al., 2024, "RewardBench: Evaluating Reward
Models for Language Modeling"): the verifier scores both responses of each ``(prompt, chosen, rejected)`` pair; the
pair counts 1 when ``chosen`` scores higher, 0.5 on a tie (a judge that gives both the same number prefers neither),
0 otherwise. The accuracy is the mean over pairs, with a 95% percentile bootstrap interval over pairs
(``scipy.stats.bootstrap``, 10,000 resamples, seed 0); 0.5 is a coin. A pair with a response the verifier could not
score (a verifier error) is left out and counted.

``PAIRS`` is JSON Lines, one pair a line::

    {"prompt": "...", "chosen": "...", "rejected": "...", "answer": "...", "kind": "..."}

``answer`` (the reference, ``{reference}`` in a judge's rubric; default ``""``) and ``kind`` (a label for the
rejected response, e.g. ``rude`` or ``restates``: the table has a row per kind) are optional.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlzoo.config.schema import RunConfig
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.interfaces.run_facts import RunFacts
from rlzoo.interfaces.task import Sample
from rlzoo.interfaces.verifier import Verdict, Verifier
from rlzoo.preflight.model import policy_facts
from rlzoo.registry import Registry
from rlzoo.runtime.assembly import make_task, verifier_for

REQUIRED = ("prompt", "chosen", "rejected")
RESAMPLES = 10_000


@dataclass(frozen=True)
class Pair:
    sample: Sample
    chosen: str
    rejected: str
    kind: str


@dataclass(frozen=True)
class Row:
    kind: str
    pairs: int
    accuracy: float
    low: float
    high: float
    ties: int
    chosen_mean: float
    rejected_mean: float


def read_pairs(path: Path) -> list[Pair]:
    """The file's pairs; a line that is not a pair is an error naming the file, the line and the field."""
    if not path.is_file():
        raise RlzooError(f"check-verifier: {path} is not a file")
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise RlzooError(f"check-verifier: {path} line {number} is not JSON ({err.msg})") from None
        if not isinstance(item, dict):
            raise RlzooError(f"check-verifier: {path} line {number} is not a JSON object")
        for name in (*REQUIRED, "answer", "kind"):
            if name in REQUIRED and name not in item:
                raise RlzooError(f"check-verifier: {path} line {number} has no {name!r}")
            if name in item and not isinstance(item[name], str):
                raise RlzooError(f"check-verifier: {path} line {number}: {name!r} is not a string")
        sample = Sample(prompt=item["prompt"], answer=item.get("answer", ""))
        pairs.append(Pair(sample, item["chosen"], item["rejected"], item.get("kind", "all")))
    if not pairs:
        raise RlzooError(f"check-verifier: {path} holds no pair")
    return pairs


def checked_verifier(config: RunConfig, registry: Registry) -> Verifier:
    """The config's verifier, after the start-up checks ``rlzoo train`` makes of it (a judge's endpoint answers,
    its key's variable is set)."""
    verifier = verifier_for(config, make_task(config, registry), registry)
    run = RunFacts(config, policy_facts(config), 1, registry, {"verifier": verifier})
    problems = verifier.preflight(run, "verifier")
    if problems:
        raise ConfigError(problems)
    return verifier


def pair_outcomes(verifier: Verifier, pairs: list[Pair]) -> tuple[list[tuple[Pair, float, float]], int]:
    """Each scored pair with its chosen and rejected rewards (one batch: a service verifier asks concurrently),
    and how many pairs had a response that could not be scored."""
    samples = [p.sample for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    verdicts = verifier.verify_batch(samples, responses)
    scored, errors = [], 0
    for i, pair in enumerate(pairs):
        chosen, rejected = verdicts[i], verdicts[len(pairs) + i]
        if isinstance(chosen, Verdict) and isinstance(rejected, Verdict):
            scored.append((pair, chosen.reward, rejected.reward))
        else:
            errors += 1
    return scored, errors


def summarise(kind: str, scored: list[tuple[Pair, float, float]]) -> Row:
    """The kind's pairwise accuracy (ties 0.5) with its 95% bootstrap interval, and the mean rewards."""
    from scipy.stats import bootstrap

    wins = np.array([1.0 if c > r else 0.5 if c == r else 0.0 for _, c, r in scored])
    accuracy = float(wins.mean())
    if np.ptp(wins) == 0:  # every pair alike: no resample differs (scipy would warn and return nan)
        low = high = accuracy
    else:
        ci = bootstrap((wins,), np.mean, n_resamples=RESAMPLES, method="percentile", random_state=0)
        low, high = float(ci.confidence_interval.low), float(ci.confidence_interval.high)
    return Row(
        kind,
        len(scored),
        accuracy,
        low,
        high,
        int((wins == 0.5).sum()),
        float(np.mean([c for _, c, _ in scored])),
        float(np.mean([r for _, _, r in scored])),
    )


def check(verifier: Verifier, pairs: list[Pair]) -> tuple[list[Row], int]:
    """One row per kind of rejected response (in the file's order), then ``all`` when there are several kinds;
    and the number of pairs left out as verifier errors."""
    scored, errors = pair_outcomes(verifier, pairs)
    if not scored:
        raise RlzooError(f"check-verifier: the verifier scored no pair ({errors} with a verifier error)")
    kinds = list(dict.fromkeys(p.kind for p, _, _ in scored))
    rows = [summarise(kind, [s for s in scored if s[0].kind == kind]) for kind in kinds]
    if len(kinds) > 1:
        rows.append(summarise("all", scored))
    return rows, errors


def table(rows: list[Row], errors: int, name: str) -> str:
    """The rows as a Markdown table, and what was left out."""
    lines = [
        f"verifier {name}: pairwise accuracy (chosen scored above rejected; ties 0.5; 0.5 is a coin)",
        "",
        "| rejected | pairs | accuracy [95% CI] | ties | chosen mean | rejected mean |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.kind} | {row.pairs} | {row.accuracy:.3f} [{row.low:.3f}, {row.high:.3f}] | {row.ties} | "
            f"{row.chosen_mean:.3f} | {row.rejected_mean:.3f} |"
        )
    if errors:
        lines += ["", f"{errors} pair(s) left out: a response the verifier could not score (verifier errors)"]
    return "\n".join(lines)
