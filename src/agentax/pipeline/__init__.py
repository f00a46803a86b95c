"""agentax.pipeline (see DESIGN.md)."""
