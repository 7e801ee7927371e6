"""The ``rlzoo`` entry point of rlzoo-estimators: hook implementations returning the component classes."""

from __future__ import annotations

import rlzoo
from rlzoo_estimators.advantages.gae import GAEAdvantage
from rlzoo_estimators.advantages.gdpo import GDPOAdvantage
from rlzoo_estimators.advantages.gpg import GPGAdvantage
from rlzoo_estimators.advantages.group import GroupAdvantage
from rlzoo_estimators.advantages.grpo_passk import PassKAdvantage
from rlzoo_estimators.advantages.opo import OPOAdvantage
from rlzoo_estimators.advantages.optimal_token_baseline import OptimalTokenBaselineAdvantage
from rlzoo_estimators.advantages.process import ProcessAdvantage
from rlzoo_estimators.advantages.reinforce_pp import ReinforcePlusPlusAdvantage
from rlzoo_estimators.advantages.reinforce_pp_baseline import ReinforcePlusPlusBaselineAdvantage
from rlzoo_estimators.advantages.remax import ReMaxAdvantage
from rlzoo_estimators.advantages.reverse_kl import ReverseKLAdvantage
from rlzoo_estimators.advantages.rloo import RLOOAdvantage
from rlzoo_estimators.advantages.tir_optimal_token_baseline import TIROptimalTokenBaselineAdvantage
from rlzoo_estimators.aggregations.seq_mean_token_mean import SeqMeanTokenMean
from rlzoo_estimators.aggregations.seq_mean_token_sum import SeqMeanTokenSum
from rlzoo_estimators.aggregations.seq_mean_token_sum_norm import SeqMeanTokenSumNorm
from rlzoo_estimators.aggregations.token_mean import TokenMean
from rlzoo_estimators.clippers.cispo import CISPOClipper
from rlzoo_estimators.clippers.clip_cov import ClipCovClipper
from rlzoo_estimators.clippers.dppo_kl import DPPOKLClipper
from rlzoo_estimators.clippers.dppo_tv import DPPOTVClipper
from rlzoo_estimators.clippers.dro import DROClipper
from rlzoo_estimators.clippers.dual_clip import DualClipper
from rlzoo_estimators.clippers.gmpo import GMPOClipper
from rlzoo_estimators.clippers.kl_cov import KLCovClipper
from rlzoo_estimators.clippers.none import NoClipper
from rlzoo_estimators.clippers.ppo import PPOClipper
from rlzoo_estimators.clippers.sapo import SAPOClipper
from rlzoo_estimators.clippers.vespo import VESPOClipper
from rlzoo_estimators.corrections.icepop import IcePop
from rlzoo_estimators.corrections.none import NoCorrection
from rlzoo_estimators.corrections.opsm import OffPolicySequenceMask
from rlzoo_estimators.corrections.rejection import RejectionSampling
from rlzoo_estimators.corrections.tis import TruncatedIS
from rlzoo_estimators.filters.dynamic_sampling import DynamicSampling
from rlzoo_estimators.filters.none import NoFilter
from rlzoo_estimators.kl.k1 import K1
from rlzoo_estimators.kl.k2 import K2
from rlzoo_estimators.kl.k3 import K3
from rlzoo_estimators.kl_controllers.adaptive import AdaptiveKLController
from rlzoo_estimators.kl_controllers.fixed import FixedKLController
from rlzoo_estimators.ratios.gpg import GPGRatio
from rlzoo_estimators.ratios.sequence import SequenceRatio
from rlzoo_estimators.ratios.sequence_token import SequenceTokenRatio
from rlzoo_estimators.ratios.token import TokenRatio
from rlzoo_estimators.regularisers.entropy import EntropyBonus
from rlzoo_estimators.shapers.length import LengthPenalty
from rlzoo_estimators.shapers.overlong import OverlongShaping
from rlzoo_estimators.value_losses.clipped import ClippedValueLoss
from rlzoo_estimators.value_losses.unclipped import UnclippedValueLoss


@rlzoo.hookimpl
def rlzoo_ratio_estimators() -> list[type]:
    return [TokenRatio, SequenceRatio, SequenceTokenRatio, GPGRatio]


@rlzoo.hookimpl
def rlzoo_advantage_sources() -> list[type]:
    return [
        GroupAdvantage,
        RLOOAdvantage,
        ProcessAdvantage,
        ReinforcePlusPlusAdvantage,
        ReinforcePlusPlusBaselineAdvantage,
        OPOAdvantage,
        GPGAdvantage,
        GAEAdvantage,
        ReverseKLAdvantage,
        ReMaxAdvantage,
        PassKAdvantage,
        GDPOAdvantage,
        OptimalTokenBaselineAdvantage,
        TIROptimalTokenBaselineAdvantage,
    ]


@rlzoo.hookimpl
def rlzoo_clippers() -> list[type]:
    return [
        PPOClipper, DualClipper, NoClipper, CISPOClipper, SAPOClipper, GMPOClipper, KLCovClipper, ClipCovClipper,
        DPPOTVClipper, DPPOKLClipper, DROClipper, VESPOClipper,
    ]


@rlzoo.hookimpl
def rlzoo_aggregations() -> list[type]:
    return [TokenMean, SeqMeanTokenMean, SeqMeanTokenSum, SeqMeanTokenSumNorm]


@rlzoo.hookimpl
def rlzoo_kl_estimators() -> list[type]:
    return [K1, K2, K3]


@rlzoo.hookimpl
def rlzoo_corrections() -> list[type]:
    return [NoCorrection, TruncatedIS, IcePop, RejectionSampling, OffPolicySequenceMask]


@rlzoo.hookimpl
def rlzoo_batch_filters() -> list[type]:
    return [NoFilter, DynamicSampling]


@rlzoo.hookimpl
def rlzoo_reward_shapers() -> list[type]:
    return [OverlongShaping, LengthPenalty]


@rlzoo.hookimpl
def rlzoo_regularisers() -> list[type]:
    return [EntropyBonus]


@rlzoo.hookimpl
def rlzoo_value_losses() -> list[type]:
    return [ClippedValueLoss, UnclippedValueLoss]


@rlzoo.hookimpl
def rlzoo_kl_controllers() -> list[type]:
    return [FixedKLController, AdaptiveKLController]
