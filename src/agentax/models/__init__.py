"""agentax.models (see DESIGN.md)."""
