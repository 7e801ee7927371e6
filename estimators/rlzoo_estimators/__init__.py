"""rlzoo-estimators: the first-party algorithm components of rlzoo.

Ratio estimators (token, sequence, sequence-token, gpg), advantage sources (group, rloo, process, reinforce++,
reinforce++-baseline, opo, gpg), clippers / policy losses (ppo, dual-clip, none, cispo, sapo, gmpo, kl-cov,
clip-cov), loss aggregations (token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm), KL
estimators (k1, k2, k3) and train-inference corrections (none, tis, icepop). Each registers where it is
defined (``@rlzoo.register``) and reaches rlzoo only through the ``rlzoo`` entry point, whose module
(:mod:`rlzoo_estimators.plugin`) names this package; docs/components.md tables them all.
"""

__version__ = "0.1.0"
