"""agentax.cli (see DESIGN.md)."""
