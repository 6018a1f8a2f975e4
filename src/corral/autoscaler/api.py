"""The autoscaler's contract: what it is told and what it answers (STYLE.md habit 1).

``autoscale(request) -> Reply`` (``policy.py``) is pure, like ``schedule``: the
server's loop (``server/loops/autoscale.py``) and the simulator gather the
facts, call it, and carry out the reply through a provider (``provider.py``).
Nothing here reads a clock, the network or a random source; ``now`` and every
"since" are inputs, so hysteresis is testable in microseconds.

Words:

* a **pool** is a kind of machine the provider can start (8x A100, 1x 4090)
  with a floor and a ceiling of how many;
* a **member** is one machine the provider runs for a pool; its agent joins
  as the node of the same name. Nodes that are no pool's member (machines
  you run yourself) are never touched;
* **pending** work is a queued job the scheduler could not place, with when it
  started waiting and the scheduler's reason codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from corral.core.errors import InvalidSpec
from corral.core.model import EMPTY, Job, Node, frozen_map


@dataclass(frozen=True, slots=True)
class Pool:
    """Machines of one shape the provider can start, between ``min_nodes`` and ``max_nodes``."""

    name: str
    gpus: int = 0  # per machine
    gpu_model: str = ""
    vram_bytes: int = 0  # per GPU
    cpus: int = 1
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    backends: frozenset[str] = frozenset()  # executors its agents offer; empty: any job's
    min_nodes: int = 0
    max_nodes: int = 10
    cost_per_hour: float = 0.0  # the pool that fits a job cheapest per GPU is chosen
    provider: str = ""  # which provider starts its machines ("": the only one)
    max_spend_per_hour: float | None = None  # its machines together cost at most this per hour
    fixed: bool = False  # machines you run (a fixed provider): counted, never started or stopped

    def __post_init__(self) -> None:
        where = f"pools[{self.name}]"
        if not self.name:
            raise InvalidSpec("pools[].name", "must not be empty")
        if self.gpus < 0 or self.cpus < 0 or self.vram_bytes < 0:
            raise InvalidSpec(where, "gpus, cpus and vram must not be negative")
        if self.gpus and not self.vram_bytes:
            raise InvalidSpec(f"{where}.vram", "a pool with GPUs must say their VRAM")
        if not 0 <= self.min_nodes <= self.max_nodes:
            raise InvalidSpec(
                f"{where}.min_nodes",
                f"must satisfy 0 <= min_nodes <= max_nodes, got {self.min_nodes} > "
                f"{self.max_nodes}",
            )
        if self.cost_per_hour < 0:
            raise InvalidSpec(f"{where}.cost_per_hour", "must not be negative")
        if self.max_spend_per_hour is not None and self.max_spend_per_hour < 0:
            raise InvalidSpec(f"{where}.max_spend_per_hour", "must not be negative")
        object.__setattr__(self, "labels", frozen_map(self.labels))


@dataclass(frozen=True, slots=True)
class Member:
    """A machine the provider runs for ``pool``; its agent joins as node ``name``."""

    name: str
    pool: str
    launched_at: float


@dataclass(frozen=True, slots=True)
class Pending:
    """A queued job the scheduler left unplaced since ``since``, and why (its reason codes)."""

    job: Job
    since: float
    reasons: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Config:
    """The hysteresis: how long demand waits before a launch and idleness before a removal."""

    scale_up_delay_s: float = 30.0  # demand shorter than this clears on its own: no launch
    idle_s: float = 600.0  # a member idle this long is drained, then removed
    boot_timeout_s: float = 900.0  # a member whose agent has not joined by then is removed
    lost_s: float = 300.0  # a member's node lost this long is removed (and replaced if needed)
    backoff_s: float = 300.0  # a pool whose member failed to join gets no launch for this long
    max_launch: int = 10  # machines started per decision, over all pools
    max_remove: int = 5  # machines removed per decision
    priorities: frozenset[str] = frozenset()  # classes whose work may start machines; empty: all
    max_spend_per_hour: float | None = None  # all pools' machines together cost at most this

    def __post_init__(self) -> None:
        for name in ("scale_up_delay_s", "idle_s", "boot_timeout_s", "lost_s", "backoff_s"):
            if getattr(self, name) < 0:
                raise InvalidSpec(f"autoscale.{name}", "must not be negative")
        if self.max_spend_per_hour is not None and self.max_spend_per_hour < 0:
            raise InvalidSpec("autoscale.max_spend_per_hour", "must not be negative")
        if self.max_launch < 0 or self.max_remove < 0:
            raise InvalidSpec("autoscale.max_launch", "limits must not be negative")
        classes = self.priorities
        if isinstance(classes, str) or not all(isinstance(c, str) for c in classes):
            raise InvalidSpec("autoscale.priorities", "must be a list of priority class names")
        object.__setattr__(self, "priorities", frozenset(classes))


@dataclass(frozen=True, slots=True)
class Request:
    """Everything one decision looks at.

    ``nodes``: every node the server knows, by name (members' and others').
    ``busy``: nodes with active allocations. ``idle_since``: when each idle node
    last had work (or joined). ``draining``: members the autoscaler itself
    drained on their way out. ``backoff``: pools that get no launch until then.
    ``members`` includes machines asked for that the provider does not list
    yet (``ledger.fleet``): they count against ``max_nodes`` and the spend caps
    like the machines it lists. ``leaving``: members already terminated that
    the provider still lists (``ledger.leaving``): they count against
    ``max_nodes`` and the caps, take no work and are not removed again.
    """

    now: float
    pools: tuple[Pool, ...]
    members: tuple[Member, ...]
    nodes: Mapping[str, Node] = field(default_factory=lambda: EMPTY)
    busy: frozenset[str] = frozenset()
    idle_since: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    draining: frozenset[str] = frozenset()
    pending: tuple[Pending, ...] = ()
    backoff: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    config: Config = field(default_factory=Config)
    leaving: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Launch:
    """Start ``count`` machines of ``pool``."""

    pool: str
    count: int
    reason: str


@dataclass(frozen=True, slots=True)
class Removal:
    """Stop member ``name``: its node is empty (``idle``), or never joined (``not_joined``),
    or is lost (``lost``)."""

    name: str
    pool: str
    reason: str
    code: str = "idle"


@dataclass(frozen=True, slots=True)
class Unmet:
    """Pending work no launch will serve this time, and why."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Reply:
    """The decision: launches, drains (idle members on their way out), undrains (demand came
    back before they went), removals, the pools' back-off, and the demand left unmet."""

    launches: tuple[Launch, ...] = ()
    drain: tuple[str, ...] = ()
    undrain: tuple[str, ...] = ()
    remove: tuple[Removal, ...] = ()
    backoff: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    unmet: tuple[Unmet, ...] = ()

    @property
    def idle(self) -> bool:
        """True when the reply asks for nothing to be done."""
        return not (self.launches or self.drain or self.undrain or self.remove)

    def to_json(self) -> dict[str, Any]:
        return {
            "launches": [asdict(x) for x in self.launches],
            "drain": list(self.drain),
            "undrain": list(self.undrain),
            "remove": [asdict(x) for x in self.remove],
            "backoff": dict(self.backoff),
            "unmet": [asdict(x) for x in self.unmet],
        }
