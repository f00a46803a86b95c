"""agentax.algos (see DESIGN.md)."""
