"""Clippers: ppo, dual-clip, none."""
