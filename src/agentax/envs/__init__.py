"""agentax.envs (see DESIGN.md)."""
