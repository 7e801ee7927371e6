"""Named per-token statistics of the policy's next-token distribution: the provider contract and its registry.

A component that reads a statistic declares it by name (``AdvantageSource.needs_token_stats``); the step asks the
training engine for those names (:meth:`~rlzoo.engines.base.TrainingEngine.token_stats`, after the old pass, under
the same weights) and hands them to the component in one mapping (``RewardBatch.token_stats``). An engine that
declares ``computes_token_stats`` computes any registered statistic: it runs its forward and gives each provider
the response positions' last hidden states. Adding a statistic is a provider registered here (by a plugin too:
:func:`register_token_statistic` when its module is imported) plus the component that reads it; the core does not
change. The built-in providers are in :mod:`rlzoo.engines.token_stats`.

A provider's contract::

    provider(hidden [N, H], head, targets [N], chunk_tokens) -> [N]

``hidden`` are the hidden states (after the final norm) at the ``N`` positions that predict response tokens,
``head`` the policy's output layer (``logits = head(hidden)``, ``[N, vocab]``), ``targets`` the sampled token ids;
a provider should run the head ``chunk_tokens`` positions at a time (``trainer.logits_chunk_tokens``) so that no
``[N, vocab]`` tensor exists, and compute in at least float32. It runs without gradient.

The critic's values and the teacher's log-probs come from their own engines and reach an advantage source through
their own fields (``needs_values``, ``needs_teacher``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlzoo.errors import RlzooError

#: ``provider(hidden [N, H], head, targets [N], chunk_tokens) -> [N]`` (module docstring)
TokenStatistic = Callable[[torch.Tensor, torch.nn.Module, torch.Tensor, int], torch.Tensor]

_PROVIDERS: dict[str, TokenStatistic] = {}


def register_token_statistic(name: str, provider: TokenStatistic) -> None:
    """Make statistic ``name`` computable by every engine that declares ``computes_token_stats``; a name is
    registered once (registering the same provider again is a no-op, as a module imported twice does)."""
    known = _PROVIDERS.get(name)
    if known is not None and known is not provider:
        raise RlzooError(f"token statistic {name!r} is registered already (by {known.__module__}.{known.__qualname__})")
    _PROVIDERS[name] = provider


def token_statistic(name: str) -> TokenStatistic:
    """The provider of statistic ``name``; a clear error naming the registered ones when there is none."""
    if name not in _PROVIDERS:
        raise RlzooError(
            f"no provider of the token statistic {name!r} is registered (registered: "
            f"{', '.join(token_statistic_names())}; rlzoo.interfaces.register_token_statistic)"
        )
    return _PROVIDERS[name]


def token_statistic_names() -> list[str]:
    """The registered statistics' names, sorted."""
    return sorted(_PROVIDERS)
