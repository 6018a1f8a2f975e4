"""A user's groups of one class and team, in the order of the user's oldest job in each.

``Queue`` keeps one ``Line`` per user, class and team as jobs come and go; a pass
(``ordering.LiveQueue``) walks their fronts to find each user's next job.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from corral.core.model import Job

Q = TypeVar("Q", bound=Hashable)


class Line(Generic[Q]):
    """One user's groups (of one class and team), ordered by the user's oldest job in each.

    Kept by ``Queue`` as jobs come and go, so a pass finds a user's next job by walking
    the front of its lines instead of sorting every live group's slot into a heap.
    ``firsts[i]`` is the user's first job in ``groups[i]``, by whose ``job_key`` the line
    is ordered (unique: a job is in one group). The job itself, not its key: a key tuple
    (and its float) was made per put, and lived, tracked by the cyclic collector, as long
    as the job was first. ``cursors[i]`` is what a pass's fair queue keeps of the user's
    jobs in ``groups[i]`` (an ``ordering._Slot``, made when a pass first looks there; None
    before): found by position as a pass walks the line, where a map by group on the
    user's state cost a look-up per group walked, and two more to find the jobs again.
    """

    __slots__ = ("cursors", "firsts", "groups", "state")

    def __init__(self) -> None:
        self.groups: list[Q] = []
        self.firsts: list[Job] = []
        self.cursors: list[Any] = []  # ``Any``: ``ordering._Slot``, which imports this module
        # What a pass's fair queue kept of this line's user (``ordering._User.on``), for the
        # next pass's to reuse; None when there is none. ``Any``: it refers back to the line.
        self.state: Any = None

    def forget(self) -> None:
        """The line is no longer kept: let go of the queue's state (which refers back to
        it, a cycle reference counting alone would not free)."""
        self.state = None

    def put(self, group: Q, first: Job) -> None:
        """``group`` now starts with ``first`` (for this user). After every other group
        (the usual case: the newest job of a new group) it is appended without a search."""
        firsts = self.firsts
        if not firsts or _before(firsts[-1], first):
            firsts.append(first)
            self.groups.append(group)
            self.cursors.append(None)
            return
        at = _search(firsts, first, 0)
        firsts.insert(at, first)
        self.groups.insert(at, group)
        self.cursors.insert(at, None)

    def drop(self, group: Q, first: Job) -> None:
        """``group`` no longer starts with ``first`` (it left, or was preceded)."""
        at = self._at(group, first)
        # ``pop``, not ``del``: a compiled build pops from a list natively, deletes generically
        self.firsts.pop(at)
        self.groups.pop(at)
        self.cursors.pop(at)

    def move(self, group: Q, first: Job, after: Job) -> None:
        """``group`` now starts with ``after``, a later job than ``first`` (which left):
        ``drop(group, first)`` then ``put(group, after)``, in one search of the part of
        the line after its place, and no shift when it keeps that place."""
        firsts = self.firsts
        at = self._at(group, first)
        to = _search(firsts, after, at + 1)  # where it goes among the groups after it
        if to == at + 1:
            firsts[at] = after
            return
        firsts.pop(at)
        self.groups.pop(at)
        cursor = self.cursors.pop(at)  # the same jobs: its cursor goes with it
        firsts.insert(to - 1, after)
        self.groups.insert(to - 1, group)
        self.cursors.insert(to - 1, cursor)

    def _at(self, group: Q, first: Job) -> int:
        """Where ``group``, starting with ``first``, stands in the line (a group is in it
        once: at the front, the usual case, without a search)."""
        if self.groups and self.groups[0] is group:
            return 0
        at = _search(self.firsts, first, 0)
        if at >= len(self.groups) or self.groups[at] is not group:
            raise RuntimeError(f"line out of order at {first.id!r}")
        return at


def _search(firsts: list[Job], job: Job, lo: int) -> int:
    """``bisect_left`` of ``job_key(job)`` in the keys of ``firsts`` from ``lo``, written
    out: ``bisect`` with a key function makes a tuple per step and compares generically."""
    hi = len(firsts)
    while lo < hi:
        mid = (lo + hi) // 2
        if _before(firsts[mid], job):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _before(a: Job, b: Job) -> bool:
    """``job_key(a) < job_key(b)``, field by field."""
    if a.submitted_at != b.submitted_at:
        return a.submitted_at < b.submitted_at
    return a.id < b.id


def lines_of(groups: Mapping[Q, Mapping[str, Sequence[Job]]]) -> dict[str, Line[Q]]:
    """The lines of ``groups`` (group -> user -> jobs sorted by ``job_key``), made afresh."""
    lines: dict[str, Line[Q]] = {}
    for group, holders in groups.items():
        for user, jobs in holders.items():
            if jobs:
                line = lines.get(user)
                if line is None:
                    line = lines[user] = Line()
                line.put(group, jobs[0])
    return lines
