"""Clippers (policy losses): ppo, dual-clip, none, cispo, sapo, gmpo, kl-cov, clip-cov."""
