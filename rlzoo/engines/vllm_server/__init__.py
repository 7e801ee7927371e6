"""The ``vllm-server`` rollout engine: rollouts from a pool of vLLM servers, weights through vLLM's own transfer API."""
