"""The results table (``docs/results.md``): every row of ``results/cells.py`` x 3 seeds on SmolLM2, run, archived and
summarised by one command that resumes whatever an earlier call left unfinished.

    python results/make_table.py                       # run what is missing (hours on 2 cores), then the table
    python results/make_table.py --cells grpo,gspo     # only these rows (the baseline first), then the table
    python results/make_table.py --table               # the table again from the archive, nothing run

Each row is one ``rlzoo ablate`` sweep of ``results/smollm2.yaml`` with the row's ``--set`` overrides, in
``--out``/<row> (``runs/results`` by default): rerunning resumes it (finished runs kept and verified, an
interrupted one resumed from its checkpoint; docs/ablation.md); where that folder is gone (another machine),
the row starts from the seeds the archive holds (``sweeps.restore_archived``). A finished run is archived in
``results/runs/<row>/seed<S>/`` (its ``metrics.jsonl``, ``config.yaml`` and ``provenance.json``: machine, versions,
commit, the load on the machine and ``--note``, what else ran), which is committed: the table is rebuilt from the
archive alone (:mod:`results.table`), never edited by hand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from results import sweeps  # noqa: E402 - the repository root on the path first
from results.cells import BASELINE, CELLS, SEEDS, Cell, folder_name  # noqa: E402

BASE_CONFIG = HERE / "smollm2.yaml"
ARCHIVE = HERE / "runs"


def sweep_folder(out: Path, cell: Cell) -> Path:
    return out / folder_name(cell)


def run_cell(cell: Cell, out: Path) -> int:
    """``rlzoo ablate`` for the row (resumes a partial one); its exit status."""
    return sweeps.run_sweep(
        BASE_CONFIG,
        cell.sets,
        SEEDS,
        sweep_folder(out, cell),
        cell.name,
        show_command=True,
        archive=ARCHIVE / folder_name(cell),
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", help="comma-separated row names (default: every row); the baseline runs first")
    p.add_argument("--out", default="runs/results", help="the sweeps' folder (default runs/results)")
    p.add_argument("--table", action="store_true", help="only rebuild docs/results.md from the archive")
    p.add_argument("--note", default="", help="recorded with each run archived now: what else ran on the machine")
    args = p.parse_args()
    by_name = {c.name: c for c in CELLS}
    names = [n.strip() for n in args.cells.split(",")] if args.cells else list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        print(f"error: --cells: unknown row(s) {', '.join(unknown)}; rows: {', '.join(by_name)}", file=sys.stderr)
        return 1
    failed = []
    if not args.table:
        out = Path(args.out).resolve()
        failed = sweeps.run_missing(
            sorted(names, key=lambda n: n != BASELINE),
            SEEDS,
            run=lambda name: run_cell(by_name[name], out),
            sweep=lambda name: sweep_folder(out, by_name[name]),
            archive=lambda name: ARCHIVE / folder_name(by_name[name]),
            note=args.note,
        )
    from results.table import write_results

    return sweeps.report(write_results(ARCHIVE, ROOT / "docs"), failed, "rows with failed runs")


if __name__ == "__main__":
    sys.exit(main())
