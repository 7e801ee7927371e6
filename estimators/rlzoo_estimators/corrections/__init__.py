"""Train-inference mismatch corrections: none, tis, icepop."""
