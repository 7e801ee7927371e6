"""The cold start's learning-rate schedule (rlzoo.runtime.cold_start.one_cycle) for every length, the short ones included."""

from __future__ import annotations

import pytest
import torch

from rlzoo.runtime.cold_start import one_cycle


@pytest.mark.parametrize("steps", range(0, 41))
def test_one_cycle_runs_for_any_number_of_steps_and_peaks_at_the_lr(steps):
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.ones(1))], lr=1e-3)
    schedule = one_cycle(optimizer, 1e-3, steps)  # 10 steps used to raise ZeroDivisionError here
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert all(0 < r <= 1e-3 * (1 + 1e-9) for r in rates)
    if steps >= 3:
        assert max(rates) == pytest.approx(1e-3, rel=0.01)  # the peak is reached (between two steps, nearly)
        assert rates[0] < 1e-3 / 10 and rates[-1] < 1e-3 / 10  # warmed up from low, annealed to low
    if steps >= 20:  # a real cold start keeps torch's 10% warm-up
        assert abs(rates.index(max(rates)) - (0.1 * steps - 1)) <= 1
