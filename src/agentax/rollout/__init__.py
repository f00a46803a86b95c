"""agentax.rollout (see DESIGN.md)."""
