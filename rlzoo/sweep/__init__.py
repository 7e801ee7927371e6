"""``rlzoo ablate`` and ``rlzoo compare``: multi-seed sweeps over config values, and their summaries.

One module per job: :mod:`.grid` (the cells, their run folders and the sweep manifest), :mod:`.jobs` (what each
run needs: a fresh start, a resume, or nothing), :mod:`.local` and :mod:`.ray_backend` (running the jobs),
:mod:`.stats` (mean and Student-t confidence interval), :mod:`.summary` (the table), :mod:`.plot` (the figure).
"""
