"""The DeepSpeed training engine: its config, environment, module and checkpoints."""
