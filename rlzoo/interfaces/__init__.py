"""Public component interfaces. Each kind is one small abstract class; plugins subclass them."""

from rlzoo.interfaces.advantage import AdvantageSource, RewardBatch
from rlzoo.interfaces.aggregation import LossAggregation
from rlzoo.interfaces.base import Component, Params
from rlzoo.interfaces.batch_filter import BatchFilter
from rlzoo.interfaces.clipper import Clipper, ClipResult, PolicyBatch
from rlzoo.interfaces.correction import MismatchCorrection
from rlzoo.interfaces.environment import Environment, Observation
from rlzoo.interfaces.kl import KLEstimator
from rlzoo.interfaces.kl_controller import KLController
from rlzoo.interfaces.logger import Logger, TrackedRun
from rlzoo.interfaces.ratio import RatioEstimator
from rlzoo.interfaces.regulariser import Regulariser
from rlzoo.interfaces.reward_shaper import ResponseTooLong, RewardShaper
from rlzoo.interfaces.router import RecordedRouting, RouterPolicy
from rlzoo.interfaces.run_facts import ModelFacts, Problem, RunFacts
from rlzoo.interfaces.task import Sample, Task
from rlzoo.interfaces.token_stats import TokenStatistic, register_token_statistic
from rlzoo.interfaces.tool import MalformedCall, ParsedTurn, Tool, ToolCall, ToolCallParser, ToolError, ToolTimeout
from rlzoo.interfaces.value_loss import ValueLoss, ValueLossResult
from rlzoo.interfaces.verifier import Verdict, Verifier
from rlzoo.util.reductions import Max, Mean, Min, Sum

__all__ = [
    "AdvantageSource",
    "BatchFilter",
    "ClipResult",
    "Clipper",
    "Component",
    "Environment",
    "KLController",
    "KLEstimator",
    "Logger",
    "LossAggregation",
    "ModelFacts",
    "Observation",
    "MalformedCall",
    "Max",
    "Mean",
    "Min",
    "MismatchCorrection",
    "Params",
    "ParsedTurn",
    "PolicyBatch",
    "Problem",
    "RatioEstimator",
    "RecordedRouting",
    "Regulariser",
    "RewardBatch",
    "ResponseTooLong",
    "RewardShaper",
    "RouterPolicy",
    "RunFacts",
    "Sample",
    "Sum",
    "Task",
    "TokenStatistic",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolError",
    "ToolTimeout",
    "TrackedRun",
    "ValueLoss",
    "ValueLossResult",
    "Verdict",
    "Verifier",
    "register_token_statistic",
]
