"""Loss aggregations: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""
