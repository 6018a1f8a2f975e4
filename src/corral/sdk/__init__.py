"""corral.sdk."""
