"""corral.agent."""
