"""corral.cli."""
