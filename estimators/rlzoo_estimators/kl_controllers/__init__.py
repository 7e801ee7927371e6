"""KL-in-reward controllers: fixed (a constant coefficient), adaptive (Ziegler et al. 2019's proportional one)."""
