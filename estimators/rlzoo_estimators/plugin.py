"""The ``rlzoo`` entry point of rlzoo-estimators: hook implementations returning the component classes."""

from __future__ import annotations

import rlzoo
from rlzoo_estimators.advantages.group import GroupAdvantage
from rlzoo_estimators.advantages.process import ProcessAdvantage
from rlzoo_estimators.advantages.rloo import RLOOAdvantage
from rlzoo_estimators.aggregations.seq_mean_token_mean import SeqMeanTokenMean
from rlzoo_estimators.aggregations.seq_mean_token_sum_norm import SeqMeanTokenSumNorm
from rlzoo_estimators.aggregations.token_mean import TokenMean
from rlzoo_estimators.clippers.dual_clip import DualClipper
from rlzoo_estimators.clippers.none import NoClipper
from rlzoo_estimators.clippers.ppo import PPOClipper
from rlzoo_estimators.corrections.none import NoCorrection
from rlzoo_estimators.corrections.tis import TruncatedIS
from rlzoo_estimators.kl.k1 import K1
from rlzoo_estimators.kl.k2 import K2
from rlzoo_estimators.kl.k3 import K3
from rlzoo_estimators.ratios.sequence import SequenceRatio
from rlzoo_estimators.ratios.sequence_token import SequenceTokenRatio
from rlzoo_estimators.ratios.token import TokenRatio


@rlzoo.hookimpl
def rlzoo_ratio_estimators() -> list[type]:
    return [TokenRatio, SequenceRatio, SequenceTokenRatio]


@rlzoo.hookimpl
def rlzoo_advantage_sources() -> list[type]:
    return [GroupAdvantage, RLOOAdvantage, ProcessAdvantage]


@rlzoo.hookimpl
def rlzoo_clippers() -> list[type]:
    return [PPOClipper, DualClipper, NoClipper]


@rlzoo.hookimpl
def rlzoo_aggregations() -> list[type]:
    return [TokenMean, SeqMeanTokenMean, SeqMeanTokenSumNorm]


@rlzoo.hookimpl
def rlzoo_kl_estimators() -> list[type]:
    return [K1, K2, K3]


@rlzoo.hookimpl
def rlzoo_corrections() -> list[type]:
    return [NoCorrection, TruncatedIS]
