"""Checkpoints, split by job: crash-safe files and state, saving and loading a step, verifying digests, choosing where to resume."""
