"""KL estimators: k1, k2, k3."""
