"""agentax.rewards (see DESIGN.md)."""
