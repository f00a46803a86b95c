"""agentax.agents (see DESIGN.md)."""
