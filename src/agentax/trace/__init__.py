"""agentax.trace (see DESIGN.md)."""
