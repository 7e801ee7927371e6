"""Regularisers: entropy."""
