"""Train-inference mismatch corrections."""
