"""Entry point of the ``rlzoo-verifiers`` distribution: contributes the verifier components."""

from __future__ import annotations

import rlzoo


@rlzoo.hookimpl
def rlzoo_verifiers() -> list[type]:
    from rlzoo_verifiers.code import CodeVerifier
    from rlzoo_verifiers.exact import ExactVerifier
    from rlzoo_verifiers.math import MathVerifier
    from rlzoo_verifiers.process import ProcessVerifier
    from rlzoo_verifiers.regex import RegexVerifier
    from rlzoo_verifiers.reward_model import RewardModelVerifier
    from rlzoo_verifiers.weighted import WeightedVerifier

    return [
        ExactVerifier, MathVerifier, RegexVerifier, ProcessVerifier, CodeVerifier,
        RewardModelVerifier, WeightedVerifier,
    ]
