"""Running a run: assembly and driver, cold start, processes, failure policy, run lock, signals, checkpoints."""
