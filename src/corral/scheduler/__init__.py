"""corral.scheduler."""
