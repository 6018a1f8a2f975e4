"""corral.scheduler: the pure decision ``schedule(snapshot, config, now, seed) -> Plan``.

No I/O, no clock reads, no global random: the server and the simulator call
the same function. See ``docs/scheduler.md`` for the pipeline and policies.
"""

from corral.scheduler.api import (
    Config,
    Placement,
    Plan,
    Preemption,
    Reason,
    ReasonCode,
    Remedy,
    Snapshot,
    Unplaced,
)
from corral.scheduler.fragmentation import Fragmentation, fragmentation
from corral.scheduler.incremental import Scheduler
from corral.scheduler.pipeline import DEFAULT_CONFIG, schedule

__all__ = [
    "DEFAULT_CONFIG",
    "Config",
    "Fragmentation",
    "Placement",
    "Plan",
    "Preemption",
    "Reason",
    "ReasonCode",
    "Remedy",
    "Scheduler",
    "Snapshot",
    "Unplaced",
    "fragmentation",
    "schedule",
]
