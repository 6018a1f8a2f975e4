"""Queued jobs, kept between cycles in the shapes the passes walk.

Per priority class (``ClassQueue``), jobs are split by *group* (``groups.py``), then by
user, each user's jobs sorted by ``job_key``; each user's groups are kept in the order
of the user's oldest job in each (``UserGroups``), so a pass finds each user's next job
at the front. Also kept: batchable jobs by batch key, the node labels jobs select on and
the models they name (they shape the cluster's node classes and indexes), and the jobs
of unknown classes.

Adding or removing a job costs O(log n) (plus a list shift); jobs arriving in
submission order are appended. A group or a user's groups emptied by a removal stay, empty,
for the next job like them (a user's few jobs come and go: made and dropped each time, they
cost the compiled simulator several percent); passes skip empty ones, and a sweep drops them all
once removals since the last sweep pass the queued jobs' count by ``SWEEP_AFTER``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Iterable
from typing import Final

from corral.core.model import EMPTY, Job
from corral.core.resources import ResourceRequest
from corral.scheduler.batching import batch_key
from corral.scheduler.groups import Group, bucket_floor, runtime_bucket
from corral.scheduler.need import Need, need_of
from corral.scheduler.user_groups import UserGroups, job_before, job_key

NEED_CACHE: Final = 4096  # distinct resource requests remembered; past it the cache starts afresh
SWEEP_AFTER: Final = 1024  # removals past the queued jobs' count between sweeps of empty entries

Holders = dict[str, list[Job]]
"""A group's queued jobs by user, each user's sorted by ``job_key``."""


class ClassQueue:
    """One priority class's queued jobs.

    ``groups``: each group's jobs by user. ``by_need``: the groups of each need (a
    failed fit is news for the groups of its need only). ``users``: per team, each
    user's groups (``UserGroups``). ``big``: the big jobs (whole GPUs at or past the
    queue's ``big_gpus``), oldest first, which may hold reservations; ``big_teams``: how
    many big jobs each team has queued.
    """

    __slots__ = ("big", "big_teams", "by_need", "groups", "users")

    def __init__(self) -> None:
        self.groups: dict[Group, Holders] = {}
        self.by_need: dict[Need, list[Group]] = {}
        self.users: dict[str, dict[str, UserGroups[Group]]] = {}
        self.big: list[Job] = []
        self.big_teams: dict[str, int] = {}


class Queue:
    """Every queued job, in the shapes the passes need. ``classes``: known class names."""

    def __init__(self, classes: Iterable[str], big_gpus: int | None = None) -> None:
        self.jobs: dict[str, Job] = {}  # submission (insertion) order
        self.big_gpus = big_gpus  # jobs asking this many whole GPUs or more are "big"
        self.groups: dict[str, Group] = {}  # a job's group, by job id
        self.classes: dict[str, ClassQueue] = {c: ClassQueue() for c in classes}
        self.unknown: set[str] = set()  # jobs of an unknown priority class
        self.batches: dict[Hashable, list[Job]] = {}
        self.label_keys: dict[str, int] = {}  # node labels queued jobs select on: jobs each
        self.models: dict[str, int] = {}  # models queued jobs name: jobs each
        self._needs: dict[ResourceRequest, Need] = {}
        self._interned: dict[tuple[str, Need, int, bool, int], Group] = {}
        self._removed = 0  # removals since the last sweep

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: Job, *, sort: bool = True) -> bool:
        """Queue ``job``; False (nothing changed) when its id is queued already.
        ``sort=False``: the caller calls ``sort`` later."""
        if job.id in self.jobs:
            return False
        self.jobs[job.id] = job
        need = self.need(job)
        r = job.resources
        group = self._group(
            job.team,
            need,
            job.replicas,
            r.cpu_fallback and r.wants_gpu,
            runtime_bucket(job.estimated_runtime_s),
        )
        self.groups[job.id] = group
        for label in job.node_selector:
            _increment(self.label_keys, label)
        if job.model:
            _increment(self.models, job.model)
        batch = batch_key(job)
        if batch is not None:
            _insert(self.batches.setdefault(batch, []), job, sort)
        queue = self.classes.get(job.priority)
        if queue is None:
            self.unknown.add(job.id)
            return True
        if self._is_big(need, job.replicas):
            _insert(queue.big, job, sort)
            _increment(queue.big_teams, job.team)
        _hold(queue, group, job, sort)
        return True

    def _group(self, team: str, need: Need, replicas: int, cpu: bool, bucket: int) -> Group:
        """The one group of these (made when missing)."""
        key = (team, need, replicas, cpu, bucket)
        group = self._interned.get(key)
        if group is None:
            group = self._interned[key] = Group(team, need, replicas, cpu, bucket_floor(bucket))
        return group

    def remove(self, job_id: str) -> Job:
        """Take ``job_id`` out of the queue (placed, cancelled); KeyError when not queued."""
        job = self.jobs.pop(job_id)
        group = self.groups.pop(job_id)
        for label in job.node_selector:
            _decrement(self.label_keys, label)
        if job.model:
            _decrement(self.models, job.model)
        batch = batch_key(job)
        if batch is not None:
            _remove(self.batches, batch, job)
        if job_id in self.unknown:
            self.unknown.discard(job_id)
            return job
        queue = self.classes[job.priority]
        if self._is_big(group.need, job.replicas):
            _remove_from(queue.big, job)
            _decrement(queue.big_teams, job.team)
        _release(queue, group, job)
        self._removed += 1
        if self._removed > len(self.jobs) + SWEEP_AFTER:
            self.sweep()
        return job

    def sweep(self) -> None:
        """Drop the groups and users' groups left empty by removals."""
        for queue in self.classes.values():
            for group in [g for g, holders in queue.groups.items() if not holders]:
                del queue.groups[group]
                alike = queue.by_need[group.need]
                alike.remove(group)
                if not alike:
                    del queue.by_need[group.need]
            for team, users in list(queue.users.items()):
                for user in [u for u, own in users.items() if not own.cursors]:
                    del users[user]
                if not users:
                    del queue.users[team]
        self._removed = 0

    def sort(self) -> None:
        """Sort every list after ``add(..., sort=False)`` calls."""
        for batch in self.batches.values():
            batch.sort(key=job_key)
        for queue in self.classes.values():
            queue.big.sort(key=job_key)
            queue.users.clear()
            for group, holders in queue.groups.items():
                users = queue.users.setdefault(group.team, {})
                for user, own in holders.items():
                    own.sort(key=job_key)
                    users.setdefault(user, UserGroups()).put(group, own[0], own)

    def _is_big(self, need: Need, replicas: int) -> bool:
        return self.big_gpus is not None and need.gpus * replicas >= self.big_gpus

    def need(self, job: Job) -> Need:
        """``need_of(job)``, shared by jobs with equal requests (the common case)."""
        if job.node_selector is not EMPTY or job.backend is not None:
            return need_of(job)
        r = job.resources
        need = self._needs.get(r)
        if need is None:
            if len(self._needs) >= NEED_CACHE:
                self._needs.clear()
            need = self._needs[r] = need_of(job)
        return need


def _hold(queue: ClassQueue, group: Group, job: Job, sort: bool) -> None:
    """Put ``job`` in its group's list of its user (and in the user's groups)."""
    holders = queue.groups.get(group)
    if holders is None:
        holders = queue.groups[group] = {}
        alike = queue.by_need.get(group.need)
        if alike is None:
            alike = queue.by_need[group.need] = []
        alike.append(group)
    own = holders.get(job.user)
    if own is None:
        own = holders[job.user] = []
    first = own[0] if own else None
    _insert(own, job, sort)
    if not sort or own[0] is not job:
        return
    users = queue.users.get(group.team)
    if users is None:
        users = queue.users[group.team] = {}
    line = users.get(job.user)
    if line is None:
        line = users[job.user] = UserGroups()
    if first is not None:  # it is now the user's oldest in the group
        line.drop(group, first)
    line.put(group, job, own)


def _release(queue: ClassQueue, group: Group, job: Job) -> None:
    """Take ``job`` out of its group's list of its user (and out of the user's groups)."""
    holders = queue.groups[group]
    own = holders[job.user]
    was_first = own[0] is job
    _remove_from(own, job)
    if was_first:
        users = queue.users[job.team]
        line = users[job.user]
        if own:
            line.move(group, job, own[0])
        else:
            line.drop(group, job)  # an emptied line stays (``Queue.sweep``)
    if not own:
        del holders[job.user]  # an emptied group stays (``Queue.sweep``)


def _insert(own: list[Job], job: Job, sort: bool) -> None:
    if not sort or not own or not job_before(job, own[-1]):
        own.append(job)
    else:
        insort(own, job, key=job_key)


def _remove(lists: dict[Hashable, list[Job]], key: Hashable, job: Job) -> None:
    own = lists[key]
    _remove_from(own, job)
    if not own:
        del lists[key]


def _remove_from(own: list[Job], job: Job) -> None:
    if own[0] is job:  # the usual case: jobs leave oldest first
        del own[0]
        return
    at = bisect_left(own, job_key(job), key=job_key)
    if at < len(own) and own[at] is job:
        del own[at]
    else:
        own.remove(job)  # not where its key says: only if the caller broke the order


def _increment(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts[key] - 1
    if left > 0:
        counts[key] = left
    else:
        del counts[key]
