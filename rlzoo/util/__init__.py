"""Small helpers every layer may use: byte sizes, atomic files, tensor helpers, seeds, pass@k, decoding, timers, metric reductions. They import nothing of rlzoo but its errors."""
