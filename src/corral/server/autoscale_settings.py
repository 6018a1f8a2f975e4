"""Settings of the autoscaler (``CORRAL_AUTOSCALE__*``; docs/autoscaler.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr


class AutoscaleSettings(BaseModel):
    """Machines started and stopped through a provider (docs/autoscaler.md). Off by default."""

    pools_file: Path | None = Field(
        default=None,
        description="YAML or JSON file of the pools the provider can start; setting it turns "
        "the autoscaler on (with a command or a webhook)",
    )
    command: str = Field(
        default="",
        description="provider: this program is run with list, launch or terminate and JSON "
        "on stdin (e.g. 'python examples/autoscale/local_provider.py')",
    )
    webhook_url: str = Field(default="", description="provider: POST JSON actions to this URL")
    webhook_token: SecretStr | None = Field(
        default=None, description="bearer token sent to the webhook"
    )
    agent_server: str = Field(
        default="",
        description="the address launched agents dial (default grpc://<api.host>:<agents.port>)",
    )
    agent_token: SecretStr | None = Field(
        default=None,
        description="join token given to launched agents (default: one is made at start)",
    )
    tick_s: float = Field(default=15.0, gt=0, description="how often the autoscaler decides")
    scale_up_delay_s: float = Field(
        default=30.0, ge=0, description="work must wait this long unplaced before a launch"
    )
    idle_s: float = Field(
        default=600.0, ge=0, description="a machine idle this long is drained, then removed"
    )
    boot_timeout_s: float = Field(
        default=900.0, gt=0, description="a machine whose agent has not joined by then is removed"
    )
    lost_s: float = Field(
        default=300.0, ge=0, description="a machine whose node is lost this long is removed"
    )
    backoff_s: float = Field(
        default=300.0, ge=0, description="a pool whose launch failed gets none for this long"
    )
    priorities: list[str] = Field(
        default_factory=list,
        description="only work of these priority classes starts machines (empty: every "
        "class); other work still runs on machines that are there",
    )
    max_spend_per_hour: float | None = Field(
        default=None,
        ge=0,
        description="all pools' machines (running and launching) cost at most this per hour "
        "together; a launch that would pass it is not made (unset: no cap)",
    )
    max_launch: int = Field(default=10, ge=0, description="machines started per decision")
    max_remove: int = Field(default=5, ge=0, description="idle machines removed per decision")
    provider_timeout_s: float = Field(
        default=120.0, gt=0, description="a provider call taking longer fails"
    )

    @property
    def enabled(self) -> bool:
        return self.pools_file is not None
