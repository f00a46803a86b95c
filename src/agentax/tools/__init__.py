"""agentax.tools (see DESIGN.md)."""
