"""Ratio estimators: token, sequence (GSPO), sequence-token (GSPO-token), gpg (no ratio)."""
