"""A user's groups of one class and team, in the order of the user's oldest job in each.

``Queue`` keeps one ``UserGroups`` per user, class and team as jobs come and go; a pass
(``ordering.LiveQueue``) walks their fronts to find each user's next job, so it looks at
the front of each user's groups instead of sorting every live group into a heap.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, Generic, TypeVar

from corral.core.compiled import mypyc_attr
from corral.core.model import Job

Q = TypeVar("Q", bound=Hashable)


def job_key(job: Job) -> tuple[float, str]:
    """A user's own jobs run oldest first (FIFO), ids breaking ties."""
    return (job.submitted_at, job.id)


def job_before(a: Job, b: Job) -> bool:
    """``job_key(a) < job_key(b)`` without making the two tuples (the queues compare jobs
    on every add, remove and turn)."""
    if a.submitted_at != b.submitted_at:
        return a.submitted_at < b.submitted_at
    return a.id < b.id


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
class GroupCursor:
    """One user's jobs in one group, and a pass's cursor over them.

    ``group``; ``first``, the user's oldest job there (by whose ``job_key`` the user's
    groups are ordered); ``jobs``, the user's jobs there (the queue's own list, sorted by
    ``job_key``: the same list while the group stays in the user's groups). The cursor
    belongs to the pass that last took it up (``epoch``, 0: none yet): ``at`` is its next
    job not yet handed out, ``seq`` the order the pass took it up in (ties between a
    user's groups). ``group`` is ``Any``: the cursor is not generic in its group.
    """

    __slots__ = ("at", "epoch", "first", "group", "jobs", "seq")

    def __init__(self, group: Any, first: Job, jobs: list[Job]) -> None:
        self.group = group
        self.first = first
        self.jobs = jobs
        self.at = 0
        self.seq = 0
        self.epoch = 0


class UserGroups(Generic[Q]):
    """One user's groups (of one class and team), ordered by the user's oldest job in each.

    ``cursors[i]`` is the ``i``-th group's ``GroupCursor``. The order is by the first
    jobs' ``job_key``, which is unique: a job is in one group.
    """

    __slots__ = ("cursors",)

    def __init__(self) -> None:
        self.cursors: list[GroupCursor] = []

    @property
    def groups(self) -> list[Q]:
        """The groups in order (a new list)."""
        return [cursor.group for cursor in self.cursors]

    @property
    def firsts(self) -> list[Job]:
        """The user's first job in each group, in order (a new list)."""
        return [cursor.first for cursor in self.cursors]

    def put(self, group: Q, first: Job, jobs: list[Job]) -> None:
        """``group`` now starts with ``first`` (for this user), who has ``jobs`` there
        (``first`` among them)."""
        cursors = self.cursors
        cursor = GroupCursor(group, first, jobs)
        if not cursors or job_before(cursors[-1].first, first):
            cursors.append(cursor)  # the usual case: the newest job, of a new group
            return
        cursors.insert(self._search(first, 0), cursor)

    def drop(self, group: Q, first: Job) -> None:
        """``group`` no longer starts with ``first`` (it left, or was preceded)."""
        del self.cursors[self._at(group, first)]

    def move(self, group: Q, first: Job, after: Job) -> None:
        """``group`` now starts with ``after``, a later job than ``first`` (which left).
        Its cursor goes with it: the same jobs, and a pass's place in them."""
        cursors = self.cursors
        at = self._at(group, first)
        to = self._search(after, at + 1)
        cursor = cursors[at]
        cursor.first = after
        if to != at + 1:
            del cursors[at]
            cursors.insert(to - 1, cursor)

    def _at(self, group: Q, first: Job) -> int:
        """Where ``group``, starting with ``first``, stands (a group is in it once)."""
        cursors = self.cursors
        if cursors and cursors[0].group is group:
            return 0
        at = self._search(first, 0)
        if at >= len(cursors) or cursors[at].group is not group:
            raise RuntimeError(f"a user's groups out of order at {first.id!r}")
        return at

    def _search(self, job: Job, lo: int) -> int:
        """Where ``job`` goes among the first jobs from ``lo`` on (``bisect_left``, by
        ``job_before``: with a key function it cost about 2% of the compiled simulator)."""
        cursors = self.cursors
        hi = len(cursors)
        while lo < hi:
            mid = (lo + hi) // 2
            if job_before(cursors[mid].first, job):
                lo = mid + 1
            else:
                hi = mid
        return lo


def user_groups_of(groups: Mapping[Q, Mapping[str, list[Job]]]) -> dict[str, UserGroups[Q]]:
    """Each user's groups of ``groups`` (group -> user -> jobs sorted by ``job_key``)."""
    users: dict[str, UserGroups[Q]] = {}
    for group, holders in groups.items():
        for user, jobs in holders.items():
            if jobs:
                own = users.get(user)
                if own is None:
                    own = users[user] = UserGroups()
                own.put(group, jobs[0], jobs)
    return users
