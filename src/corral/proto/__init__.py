"""corral.proto."""
