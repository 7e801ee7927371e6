"""``rlzoo ablate`` and ``rlzoo compare``: multi-seed sweeps over config values, and their summaries (docs/ablation.md).

One module per job: :mod:`.grid` (the cells, their run folders and the sweep manifest), :mod:`.jobs` (what each
run still needs: a cold start, a fresh start, a resume, or nothing), :mod:`.finished` (finished runs verified
before they are kept; their checkpoints dropped on request), :mod:`.local` and :mod:`.ray_backend`
(running the jobs), :mod:`.progress` (the sweep's progress bar), :mod:`.ablate` (the command: check, run,
summarise), :mod:`.limits` (the grid-size default), :mod:`.stats` (mean and Student-t confidence interval),
:mod:`.summary` (the table), :mod:`.plot` (the figure).
"""
