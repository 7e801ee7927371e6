"""``rlzoo mismatch``: the train-inference log-prob gap of a config's engines, measured, broken down and gated."""
