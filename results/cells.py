"""The results table's rows: each a name, its row group and the ``--set`` overrides that make it from
``results/smollm2.yaml`` (GRPO with ``kl_coef: 0`` and the rollout engine's log-probs as the old policy's).

Every row has the same budget: 40 steps of 4 prompts x 8 samples of at most 24 tokens, evaluated on the same 64
held-out prompts x 2 samples every 10 steps, seeds 0, 1, 2. Where a preset would change the budget, the row keeps
the budget and says what it leaves out (``note``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

BASELINE = "grpo"
SEEDS = 3  # seeds 0, 1, 2 of every row


@dataclass(frozen=True)
class Cell:
    name: str
    group: str  # "presets" or "components"
    sets: list[str] = field(default_factory=list)
    note: str = ""


FORMAT_PART = (
    "verifier={name: weighted, correct_from: [0], verifiers: "
    "[{name: math, label: correct}, {name: regex, label: format, pattern: '\\s*-?[0-9]+\\s*'}]}"
)

CELLS: list[Cell] = [
    Cell("grpo", "presets", ["algorithm.preset=grpo"], "the baseline of every paired difference"),
    Cell("dr-grpo", "presets", ["algorithm.preset=dr-grpo"]),
    Cell("gspo", "presets", ["algorithm.preset=gspo"]),
    Cell(
        "dapo",
        "presets",
        ["algorithm.preset=dapo", "algorithm.batch_filter={name: none}"],
        "without dynamic sampling (it would draw up to 10 generation batches a step: another sample budget)",
    ),
    Cell("cispo", "presets", ["algorithm.preset=cispo"]),
    Cell("sapo", "presets", ["algorithm.preset=sapo"]),
    Cell("gmpo", "presets", ["algorithm.preset=gmpo"]),
    Cell("rloo", "presets", ["algorithm.preset=rloo"]),
    Cell("reinforce++", "presets", ["algorithm.preset=reinforce++"]),
    Cell(
        "gpg",
        "presets",
        ["algorithm.preset=gpg", "algorithm.minibatches_per_rollout=1"],
        "one update per batch, as the preset sets (it has no ratio to correct an off-policy minibatch)",
    ),
    Cell("dppo-tv", "presets", ["algorithm.preset=dppo-tv"]),
    Cell(
        "gdpo",
        "presets",
        ["algorithm.preset=gdpo", FORMAT_PART],
        "two reward parts, each group-normalised: correct (math) and format (the response is a bare number); "
        "accuracy counts the first only",
    ),
    Cell("pass@k", "presets", ["algorithm.preset=grpo", "algorithm.advantage={name: grpo-passk}"]),
    Cell("ratio: sequence", "components", ["algorithm.preset=grpo", "algorithm.ratio={name: sequence}"]),
    Cell(
        "aggregation: token-mean", "components", ["algorithm.preset=grpo", "algorithm.aggregation={name: token-mean}"]
    ),
    Cell(
        "clipper: cispo",
        "components",
        ["algorithm.preset=grpo", "algorithm.clipper={name: cispo, eps_low: 1.0, eps_high: 4.0}"],
    ),
    Cell(
        "advantage: no std",
        "components",
        ["algorithm.preset=grpo", "algorithm.advantage={name: group, std_normalize: false}"],
    ),
]


def folder_name(cell: Cell) -> str:
    """The cell's folder under the sweep root and the archive (letters, digits, ``-`` and ``+``)."""
    return "".join(ch if ch.isalnum() or ch in "-+" else "-" for ch in cell.name).strip("-").replace("--", "-")
