"""corral: an orchestrator for GPU work."""

__version__ = "0.1.0"
