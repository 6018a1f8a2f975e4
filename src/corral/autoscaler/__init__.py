"""corral.autoscaler: the pure decision ``autoscale(request) -> Reply`` and the provider seam.

No I/O, no clock reads: the server's loop and the simulator gather the facts
and carry out the reply. See ``docs/autoscaler.md``.
"""

from corral.autoscaler.api import (
    Config,
    Launch,
    Member,
    Pending,
    Pool,
    Removal,
    Reply,
    Request,
    Unmet,
)
from corral.autoscaler.policy import autoscale
from corral.autoscaler.provider import Join, Provider, ProviderError, SimulatedProvider

__all__ = [
    "Config",
    "Join",
    "Launch",
    "Member",
    "Pending",
    "Pool",
    "Provider",
    "ProviderError",
    "Removal",
    "Reply",
    "Request",
    "SimulatedProvider",
    "Unmet",
    "autoscale",
]
