"""What a run reports: metrics log, experiment trackers, console, plots."""
