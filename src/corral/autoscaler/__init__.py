"""corral.autoscaler."""
