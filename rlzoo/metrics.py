"""The declared metric reductions, as plugins import them (public API; defined in :mod:`rlzoo.util.reductions`).

A component reports ``self.report(name, Sum(value))`` to say how its value combines over a step's calls and the
ranks (docs/metrics.md, "Reductions"); ``SkippedUpdates`` and ``UnscoredResponses`` also declare a fault that the
run's failure policy counts. ``Mean``, ``Sum``, ``Min`` and ``Max`` are in :mod:`rlzoo.interfaces` too.
"""

from rlzoo.util.reductions import Declared, Max, Mean, Min, SkippedUpdates, Sum, UnscoredResponses, declared

__all__ = ["Declared", "Max", "Mean", "Min", "SkippedUpdates", "Sum", "UnscoredResponses", "declared"]
