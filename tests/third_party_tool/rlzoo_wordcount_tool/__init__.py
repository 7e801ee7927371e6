"""A third party's rlzoo tool, for tests/test_third_party_tool.py: ``word-count`` (a tool with a JSON schema and a
side effect a test can read) and ``word-count-caller`` (a rollout engine that writes a call of it on every
episode's first turn), using only rlzoo's public modules."""
