"""Value losses: clipped (PPO's clipped value loss, verl's compute_value_loss), unclipped (plain squared error)."""
