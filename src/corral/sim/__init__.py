"""corral.sim."""
