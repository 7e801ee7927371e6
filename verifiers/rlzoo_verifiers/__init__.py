"""First-party rlzoo verifiers: ``exact``, ``math``, ``regex``, ``process``, ``code``, ``reward-model``,
``weighted``, ``remote`` (a reward service) and ``judge`` (an LLM judge).

Each registers where it is defined (``@rlzoo.register``), found through the ``rlzoo`` entry-point group (see
:mod:`rlzoo_verifiers.plugin`); this package imports only rlzoo's public API. Importing it stays cheap: ``math-verify`` (sympy) loads on the first ``math`` check.
"""

from rlzoo_verifiers.code import CodeVerifier
from rlzoo_verifiers.exact import ExactVerifier
from rlzoo_verifiers.math import MathVerifier
from rlzoo_verifiers.process import ProcessVerifier
from rlzoo_verifiers.regex import RegexVerifier

__all__ = ["CodeVerifier", "ExactVerifier", "MathVerifier", "ProcessVerifier", "RegexVerifier"]
