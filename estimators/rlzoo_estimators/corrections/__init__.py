"""Train-inference mismatch corrections: none, tis, icepop (weights); rejection, opsm (rejected samples)."""
