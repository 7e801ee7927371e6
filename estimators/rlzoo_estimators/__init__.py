"""rlzoo-estimators: the first-party algorithm components of rlzoo.

Ratio estimators (token, sequence, sequence-token), advantage sources (group, rloo, process), clippers
(ppo, dual-clip, none), loss aggregations (token-mean, seq-mean-token-mean, seq-mean-token-sum-norm) and KL
estimators (k1, k2, k3). They reach rlzoo only through its plugin hooks (see :mod:`rlzoo_estimators.plugin`).
"""

__version__ = "0.1.0"
