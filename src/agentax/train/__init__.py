"""agentax.train (see DESIGN.md)."""
