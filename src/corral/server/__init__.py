"""corral.server."""
