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
    ``keys[i]`` is ``job_key`` of the user's first job in ``groups[i]`` (unique: a job is
    in one group).
    """

    __slots__ = ("groups", "keys", "state")

    def __init__(self) -> None:
        self.groups: list[Q] = []
        self.keys: list[tuple[float, str]] = []
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
        keys = self.keys
        # ``Any``: the key tuple made (and its float boxed) once; the last key compared
        # field by field, not as tuples (a generic comparison of two tuples made for it)
        key: Any = (first.submitted_at, first.id)
        if not keys or _before(keys[-1], first):
            keys.append(key)
            self.groups.append(group)
            return
        at = _search(keys, first, 0)
        keys.insert(at, key)
        self.groups.insert(at, group)

    def drop(self, group: Q, first: Job) -> None:
        """``group`` no longer starts with ``first`` (it left, or was preceded)."""
        at = self._at(group, first)
        # ``pop``, not ``del``: a compiled build pops from a list natively, deletes generically
        self.keys.pop(at)
        self.groups.pop(at)

    def move(self, group: Q, first: Job, after: Job) -> None:
        """``group`` now starts with ``after``, a later job than ``first`` (which left):
        ``drop(group, first)`` then ``put(group, after)``, in one search of the part of
        the line after its place, and no shift when it keeps that place."""
        keys = self.keys
        at = self._at(group, first)
        key: Any = (after.submitted_at, after.id)  # made once (see ``put``)
        to = _search(keys, after, at + 1)  # where it goes among the groups after it
        if to == at + 1:
            keys[at] = key
            return
        keys.pop(at)
        self.groups.pop(at)
        keys.insert(to - 1, key)
        self.groups.insert(to - 1, group)

    def _at(self, group: Q, first: Job) -> int:
        """Where ``group``, starting with ``first``, stands in the line (a group is in it
        once: at the front, the usual case, without a search)."""
        if self.groups and self.groups[0] is group:
            return 0
        at = _search(self.keys, first, 0)
        if at >= len(self.groups) or self.groups[at] is not group:
            raise RuntimeError(f"line out of order at {first.id!r}")
        return at


def _search(keys: list[tuple[float, str]], job: Job, lo: int) -> int:
    """``bisect_left(keys, job_key(job), lo)``, written out: ``bisect`` compares tuples
    generically (a compiled build reads each key's fields natively here)."""
    hi = len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        if _before(keys[mid], job):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _before(key: tuple[float, str], job: Job) -> bool:
    """``key < job_key(job)``, field by field."""
    if key[0] != job.submitted_at:
        return key[0] < job.submitted_at
    return key[1] < job.id


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
