"""Advantage sources: group (GRPO / Dr.GRPO), rloo, process (per-step rewards), reinforce++, reinforce++-baseline,
opo, gpg, gae (from a critic's values)."""
