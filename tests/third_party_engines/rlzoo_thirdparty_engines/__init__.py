"""A third party's rlzoo engines, for tests/test_third_party_engines.py: thin wrappers of the in-process engines
(``relay-rollout`` over transformers generate, ``relay-trainer`` over plain torch) that use only rlzoo's public
modules, add a start-up check rule of their own and count the core's calls of the engine contract."""
