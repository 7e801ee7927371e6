"""Ratio estimators: token, sequence (GSPO), sequence-token (GSPO-token)."""
