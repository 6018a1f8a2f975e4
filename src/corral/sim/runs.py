"""What the simulated world keeps per job and per team (``world.py`` changes them).

``JobRun`` is a job while it is in the world, queued or running; ``TeamUse`` what a team
holds and may hold (a node's free capacity is ``free.py``'s ``NodeFree``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from corral.core.compiled import mypyc_attr
from corral.core.model import Job, Team
from corral.core.resources import MILLI
from corral.core.states import JobState
from corral.sim.report import PlacementRecord

if TYPE_CHECKING:
    from mypy_extensions import i64

QUEUED: Final = JobState.QUEUED


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
class JobRun:
    """A job while it is in the world (queued or running)."""

    __slots__ = (
        "alloc",
        "attempts",
        "claims",
        "done",
        "first_start",
        "job",
        "more",
        "placements",
        "plan",
        "remaining",
        "started_at",
        "state",
        "token",
        "where",
    )

    def __init__(self, job: Job, remaining: float | None, where: str) -> None:
        self.job = job  # the latest frozen view; replaced when requeued (attempt changes)
        self.remaining = remaining  # seconds of work left at the start of this attempt
        self.where = where
        self.state: JobState = QUEUED
        self.attempts = 0
        self.first_start: float | None = None
        self.started_at = 0.0
        self.token = 0  # bumped per attempt: a completion timer of an old attempt is stale
        self.done = 0.0  # seconds of work done by earlier attempts
        # its allocations' ids (``allocs()``): the first ("" while queued), a gang's others
        self.alloc = ""
        self.more: tuple[str, ...] = ()
        self.placements: list[PlacementRecord] | None = None
        # the placements of plan number ``plan`` that place it (``World.apply``'s check)
        self.plan: i64 = 0
        self.claims: i64 = 0

    def allocs(self) -> tuple[str, ...]:
        """The ids of its allocations (none while queued)."""
        return (self.alloc, *self.more) if self.alloc else ()


class TeamUse:
    """A team's milli-GPUs held in the world, and the most it may hold (``cap``; None: no
    limit)."""

    __slots__ = ("cap", "milli")

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self.milli: i64 = 0


def cap_milli(team: Team) -> int | None:
    """The most a team may hold, in milli-GPUs: quota + borrow limit (None: no limit)."""
    if team.borrow_limit_gpus is None:
        return None
    return round((team.quota_gpus + team.borrow_limit_gpus) * MILLI)
