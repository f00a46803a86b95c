"""agentax.text (see DESIGN.md)."""
