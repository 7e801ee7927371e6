"""The vLLM rollout engine: engine, weight sync, LoRA adapters, worker extension and routing capture."""
