"""Episodes: the runner (one token sequence per episode, turns batched), the core's environments and prompt encoding."""
