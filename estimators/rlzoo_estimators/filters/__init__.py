"""Batch filters: none, dynamic-sampling."""
