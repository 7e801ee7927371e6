"""Reward shapers: overlong, length."""
