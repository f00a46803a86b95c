"""agentax.engine (see DESIGN.md)."""
