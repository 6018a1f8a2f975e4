"""A user's groups of one class and team, in the order of the user's oldest job in each.

``Queue`` keeps one ``Line`` per user, class and team as jobs come and go; a pass
(``ordering.LiveQueue``) walks their fronts to find each user's next job.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from corral.core.compiled import mypyc_attr
from corral.core.model import Job

if TYPE_CHECKING:
    from mypy_extensions import i64

Q = TypeVar("Q", bound=Hashable)


@mypyc_attr(acyclic=True)  # nothing it holds refers back to it (core/compiled.py)
class Place:
    """A group's place in a user's line: the ``group``, the user's ``first`` job in it (by
    whose ``job_key`` the line is ordered), the user's ``jobs`` there (the queue's own list,
    sorted by ``job_key``: it stays the same list while the group stays in the line), and
    a pass's cursor over them (``ordering.LiveQueue``): ``at`` the next job not yet handed
    out, ``seq`` the order the pass took it up in (ties between a user's places), ``epoch``
    the mark of the user's pass state that last took it up (0: none yet).

    One record per group in a line: where the line kept three lists (groups, first jobs,
    and a pass's slot, made when a pass first looked there and looked up again by group
    and user), each put and drop changed all three, and a pass made and freed a slot per
    group it walked. Not generic in its group (``Any``): a compiled build's acyclic class
    has no generic base."""

    __slots__ = ("at", "epoch", "first", "group", "jobs", "seq")

    def __init__(self, group: Any, first: Job, jobs: list[Job]) -> None:
        self.group = group
        self.first = first
        self.jobs = jobs
        self.at: i64 = 0
        self.seq: i64 = 0
        self.epoch: i64 = 0


class Line(Generic[Q]):
    """One user's groups (of one class and team), ordered by the user's oldest job in each.

    Kept by ``Queue`` as jobs come and go, so a pass finds a user's next job by walking
    the front of its lines instead of sorting every live group's slot into a heap.
    ``places[i]`` is the ``i``-th group's ``Place``: the group, the user's first job and
    jobs in it, and a pass's cursor there. The line is ordered by its first jobs'
    ``job_key`` (unique: a job is in one group); the jobs themselves, not their keys: a key
    tuple (and its float) was made per put, and lived, tracked by the cyclic collector, as
    long as the job was first.
    """

    __slots__ = ("places", "state")

    def __init__(self) -> None:
        self.places: list[Place] = []
        # What a pass's fair queue kept of this line's user (``ordering._User.on``), for the
        # next pass's to reuse; None when there is none. ``Any``: it refers back to the line.
        self.state: Any = None

    @property
    def groups(self) -> list[Q]:
        """The groups in line order (a new list: for tests and explanations)."""
        return [place.group for place in self.places]

    @property
    def firsts(self) -> list[Job]:
        """The user's first job in each group, in line order (a new list)."""
        return [place.first for place in self.places]

    def forget(self) -> None:
        """The line is no longer kept: let go of the queue's state (which refers back to
        it, a cycle reference counting alone would not free)."""
        self.state = None

    def put(self, group: Q, first: Job, jobs: list[Job]) -> None:
        """``group`` now starts with ``first`` (for this user), who has ``jobs`` there
        (``first`` among them). After every other group (the usual case: the newest job of
        a new group) it is appended without a search."""
        places = self.places
        place = Place(group, first, jobs)
        if not places or _before(places[-1].first, first):
            places.append(place)
            return
        places.insert(_search(places, first, 0), place)

    def drop(self, group: Q, first: Job) -> None:
        """``group`` no longer starts with ``first`` (it left, or was preceded)."""
        # ``pop``, not ``del``: a compiled build pops from a list natively, deletes generically
        self.places.pop(self._at(group, first))

    def move(self, group: Q, first: Job, after: Job) -> None:
        """``group`` now starts with ``after``, a later job than ``first`` (which left):
        ``drop(group, first)`` then ``put(group, after, ...)``, in one search of the part
        of the line after its place, and no shift when it keeps that place. Its place goes
        with it: the same jobs, and a pass's cursor over them."""
        places = self.places
        at = self._at(group, first)
        to = _search(places, after, at + 1)  # where it goes among the groups after it
        place = places[at]
        place.first = after
        if to == at + 1:
            return
        places.pop(at)
        places.insert(to - 1, place)

    def _at(self, group: Q, first: Job) -> int:
        """Where ``group``, starting with ``first``, stands in the line (a group is in it
        once: at the front, the usual case, without a search)."""
        places = self.places
        if places and places[0].group is group:
            return 0
        at = _search(places, first, 0)
        if at >= len(places) or places[at].group is not group:
            raise RuntimeError(f"line out of order at {first.id!r}")
        return at


def _search(places: list[Place], job: Job, lo: int) -> int:
    """``bisect_left`` of ``job_key(job)`` in the keys of ``places``' first jobs from
    ``lo``, written out: ``bisect`` with a key function makes a tuple per step and compares
    generically."""
    hi = len(places)
    while lo < hi:
        mid = (lo + hi) // 2
        if _before(places[mid].first, job):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _before(a: Job, b: Job) -> bool:
    """``job_key(a) < job_key(b)``, field by field."""
    if a.submitted_at != b.submitted_at:
        return a.submitted_at < b.submitted_at
    return a.id < b.id


def lines_of(groups: Mapping[Q, Mapping[str, list[Job]]]) -> dict[str, Line[Q]]:
    """The lines of ``groups`` (group -> user -> jobs sorted by ``job_key``), made afresh."""
    lines: dict[str, Line[Q]] = {}
    for group, holders in groups.items():
        for user, jobs in holders.items():
            if jobs:
                line = lines.get(user)
                if line is None:
                    line = lines[user] = Line()
                line.put(group, jobs[0], jobs)
    return lines
