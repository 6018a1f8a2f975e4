"""The ``webhooks`` settings section: how the server calls the URLs jobs name
(services/webhooks.py, docs/server.md "Webhooks")."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WebhookSettings(BaseModel):
    """Calls to the webhook URLs jobs name: bounded, so a slow or hostile receiver costs
    the server little and never delays scheduling."""

    enabled: bool = Field(default=True, description="turn job state changes into deliveries")
    allow_private: bool = Field(
        default=False,
        description="call loopback, private and link-local addresses too (tests, a receiver "
        "on this machine or LAN); off, such URLs are refused (the server faces the internet)",
    )
    timeout_s: float = Field(
        default=10.0, gt=0, le=60, description="one call's whole time: connect, send, answer"
    )
    retry_for_s: float = Field(
        default=24 * 3600.0, gt=0, description="a delivery is retried this long, then failed"
    )
    first_retry_s: float = Field(
        default=10.0, gt=0, description="the wait before the first retry; each next one doubles"
    )
    max_retry_s: float = Field(
        default=3600.0, gt=0, description="the longest wait between two attempts"
    )
    concurrency: int = Field(default=16, ge=1, le=256, description="calls in flight at once")
    per_team_concurrency: int = Field(
        default=4, ge=1, le=256, description="calls in flight at once for one team's receivers"
    )
    max_pending_per_team: int = Field(
        default=10_000,
        ge=1,
        description="deliveries waiting per team; past it new ones are recorded as failed "
        "at once (a receiver down for long, or a flood, cannot grow the table without bound)",
    )
    max_body_bytes: int = Field(
        default=64 * 1024, ge=1024, description="a delivery's JSON body (result lists cut short)"
    )
    poll_s: float = Field(
        default=1.0, gt=0, description="how often the loop looks for events and due retries"
    )
