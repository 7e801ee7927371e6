"""The built-in token statistics (the registry and the provider contract: :mod:`rlzoo.interfaces.token_stats`).

    logprobs        log pi(y_t)
    entropy         -sum_v pi(v) log pi(v)
    sum_pi_squared  sum_v pi(v)^2  (the squared norm of a softmax's gradient is 1 - 2 pi(y) + sum_v pi(v)^2, which
                    the optimal token baseline reads)

Registered when this module is imported, which every in-process training engine does
(:mod:`rlzoo.engines.module_engine`).
"""

from __future__ import annotations

import torch

from rlzoo.engines.tokens import hidden_logprobs, hidden_sum_pi_squared
from rlzoo.interfaces.token_stats import TokenStatistic, register_token_statistic, token_statistic


def _logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    return hidden_logprobs(hidden, head, targets, False, chunk)[0]


def _entropy(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    return hidden_logprobs(hidden, head, targets, True, chunk)[1]


def _sum_pi_squared(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    return hidden_sum_pi_squared(hidden, head, chunk)


register_token_statistic("logprobs", _logprobs)
register_token_statistic("entropy", _entropy)
register_token_statistic("sum_pi_squared", _sum_pi_squared)


def provider(name: str) -> TokenStatistic:
    """The provider of statistic ``name``, the built-ins above included (an engine asks here, so they are
    registered before it computes any statistic)."""
    return token_statistic(name)
