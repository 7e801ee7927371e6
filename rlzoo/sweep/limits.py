"""Limits of a sweep the command line enforces (kept apart so the CLI imports no heavy module)."""

DEFAULT_MAX_RUNS = 64  # a larger grid needs --yes
