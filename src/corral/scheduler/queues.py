"""Queued jobs, kept between cycles in the shapes the passes walk.

Per priority class, jobs are split by *group*, then by user, each user's
jobs sorted by ``job_key``. A group is a set of jobs the planner treats alike
(same team, per-replica need, replicas, CPU fallback, run-time estimate
bucket): when one of them is known not to fit, none of them does, so a pass
skips a whole group at once (``passes.py``) instead of walking its jobs, and
only looks at the users holding jobs in groups that may still be placed.
Also kept: batchable jobs by batch key, the node labels jobs select on and
the models they name (they shape the cluster's classes and indexes), and the
jobs of unknown classes.

Adding or removing a job costs O(log n) (plus a list shift); jobs arriving
in submission order are appended.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Final, TypeVar

from corral.core.model import EMPTY, Job
from corral.core.resources import ResourceRequest
from corral.scheduler.batching import batch_key
from corral.scheduler.lines import Line, lines_of
from corral.scheduler.need import Need, need_of
from corral.scheduler.ordering import job_key

if TYPE_CHECKING:
    from mypy_extensions import i64

    from corral.scheduler.quota import Book

HK = TypeVar("HK", bound=Hashable)
NEED_CACHE: Final = 4096  # distinct resource requests remembered; past it the cache starts afresh
IDLE_LINES: Final = 1024  # empty lines kept past the queued jobs' count before a sweep
IDLE_GROUPS: Final = 1024  # groups kept with no job (any class) past the queued jobs' count, ditto
RECENT_REQUESTS: Final = 8  # the first requests seen, found by identity in a scan (``need``,
# and the simulator's report for its size groups: a trace has a handful of shapes)


class Group:
    """Jobs the planner treats alike when they do not fit (see ``Planner.live``).

    Interned by ``Queue``: equal groups are the same object, so a group is a
    dictionary key by identity (hashing it is free on the hot path).
    """

    __slots__ = (
        "book",
        "bound",
        "cpu",
        "fits",
        "floor",
        "lowest",
        "need",
        "paged",
        "replicas",
        "seen",
        "team",
    )

    def __init__(
        self, team: str, need: Need, replicas: int, cpu: bool, floor: float | None
    ) -> None:
        self.team = team
        self.need = need
        self.replicas = replicas
        self.cpu = cpu  # may fall back to CPU slots (``cpu_fallback`` of a GPU job)
        self.floor = floor  # a lower bound of the run-time estimates in it; None: none
        self.lowest = need.nominal_milli() * replicas  # the least milli a job of it takes
        # What a pass's ``passes.Liveness`` found, valid while ``seen`` is its stamp: may
        # a job of it fit (memos of its need), the most its team may hold in the pass, and
        # its team's page of the ledger (what it holds now, as the pass places work).
        self.seen: i64 = 0
        self.fits = False
        self.bound = 0.0
        self.book: Book | None = None  # its team's page of the pass's ledger (``quota.Book``)
        self.paged: i64 = 0  # the ``serial`` of the ledger ``book`` is a page of (0: none)

    def __repr__(self) -> str:
        return f"Group({self.team!r}, {self.need!r}, {self.replicas}, {self.cpu}, {self.floor})"


Holders = dict[str, list[Job]]
"""A group's queued jobs by user, each user's sorted by ``job_key``."""


class ClassMaps:
    """One class's share of each of ``Queue``'s maps by class (the same objects): a job
    added or removed looks its class up once, not once per map."""

    __slots__ = ("big", "big_teams", "by_need", "by_team", "groups", "lines")

    def __init__(self, queue: Queue, cls: str) -> None:
        self.groups = queue.lists[cls]
        self.by_team = queue.by_team[cls]
        self.by_need = queue.by_need[cls]
        self.lines = queue.lines[cls]
        self.big = queue.big[cls]
        self.big_teams = queue.big_teams[cls]


def runtime_bucket(estimate: float | None) -> int:
    """The bucket of an estimate: powers of two, so a group holds similar run times. By
    its exponent, a small int (a key hashed and compared as one object): the bits of the
    whole seconds, -1 under a second, -2 without an estimate (``bucket_floor``)."""
    if estimate is None:
        return -2
    return -1 if estimate < 1 else int(estimate).bit_length()


def bucket_floor(bucket: int) -> float | None:
    """The least estimate of ``bucket`` (``runtime_bucket``): a power of two, 0 under a
    second, None without an estimate."""
    if bucket == -2:
        return None
    return 0.0 if bucket == -1 else float(1 << (bucket - 1))


class Queue:
    """Every queued job, in the shapes the passes need. ``classes``: known class names."""

    def __init__(self, classes: Iterable[str], big_gpus: int | None = None) -> None:
        self.jobs: dict[str, Job] = {}  # submission (insertion) order
        self.big_gpus = big_gpus  # jobs asking this many whole GPUs or more are "big"
        self.groups: dict[str, Group] = {}  # a job's group (its need: ``group.need``)
        self.lists: dict[str, dict[Group, Holders]] = {c: {} for c in classes}
        # The same groups per class split two ways, kept so that a pass does not sort
        # every group of its class out again: by team (the borrowing pass's queue per
        # team) and by need (a failed fit touches the groups of its need).
        self.by_team: dict[str, dict[str, dict[Group, Holders]]] = {c: {} for c in self.lists}
        self.by_need: dict[str, dict[Need, list[Group]]] = {c: {} for c in self.lists}
        # Per class, team and user: the user's groups by its oldest job in each (``Line``):
        # where a pass looks for each user's next job.
        self.lines: dict[str, dict[str, dict[str, Line[Group]]]] = {c: {} for c in self.lists}
        self.big: dict[str, list[Job]] = {c: [] for c in self.lists}  # per class, oldest first
        # their teams; counts in plain dicts (here and below): a compiled build reads and
        # writes a dict natively, a ``Counter`` (a subclass) generically
        self.big_teams: dict[str, dict[str, int]] = {c: {} for c in self.lists}
        self._kept = {c: ClassMaps(self, c) for c in self.lists}
        self.unknown: set[str] = set()  # jobs of an unknown priority class
        self.batches: dict[Hashable, list[Job]] = {}
        self.label_keys: dict[str, int] = {}
        self.models: dict[str, int] = {}
        self._needs: dict[ResourceRequest, Need] = {}
        self._by_request: dict[int, tuple[ResourceRequest, Need]] = {}  # by id(request)
        self._recent: list[tuple[ResourceRequest, Need]] = []  # the first few, scanned
        self._groups: dict[Need, dict[int, list[Group]]] = {}  # interned: need, bucket (``_group``)
        self._stamps: i64 = 0  # the last stamp handed out (``stamp``)
        self._idle = 0  # lines kept empty (``_relined``)
        self._idle_groups = 0  # groups kept with no job (``remove``)

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: Job, *, sort: bool = True) -> bool:
        """Queue ``job``; False (nothing changed) when its id is queued already.
        ``sort=False``: the caller calls ``sort`` later."""
        job_id, cls, r = job.id, job.priority, job.resources
        if self.jobs.setdefault(job_id, job) is not job:  # one look-up: test and store
            return False
        need = self.need(job)
        cpu = r.cpu_fallback and r.wants_gpu
        bucket = runtime_bucket(job.estimated_runtime_s)
        group = self._group(job.team, need, job.replicas, cpu, bucket)
        self.groups[job_id] = group
        if job.node_selector is not EMPTY:  # not its truth: a generic call on a Mapping
            for label in job.node_selector:
                _increment(self.label_keys, label)
        if job.model:
            _increment(self.models, job.model)
        if job.batch_key is not None:
            batch = batch_key(job)
            if batch is not None:
                _insert(self.batches.setdefault(batch, []), job, sort)
        kept = self._kept.get(cls)
        if kept is None:
            self.unknown.add(job_id)
            return True
        if self._is_big(need, job.replicas):
            _insert(kept.big, job, sort)
            _increment(kept.big_teams, job.team)
        self._hold(kept, group, job, sort)
        return True

    def _group(self, team: str, need: Need, replicas: int, cpu: bool, bucket: int) -> Group:
        """The one group of these (made when missing). Found by need, then run-time bucket
        (a small int), then a scan of the few there: a key tuple of all five, made, hashed
        (the need's hash a method call) and freed per job, cost twice as much."""
        by_bucket = self._groups.get(need)
        if by_bucket is None:
            by_bucket = self._groups[need] = {}
        alike = by_bucket.get(bucket)
        if alike is None:
            alike = by_bucket[bucket] = []
        for group in alike:
            if group.team == team and group.replicas == replicas and group.cpu == cpu:
                return group
        group = Group(team, need, replicas, cpu, bucket_floor(bucket))
        alike.append(group)
        return group

    def _hold(self, kept: ClassMaps, group: Group, job: Job, sort: bool) -> None:
        """Put ``job`` in its group's list of its user (and the kept splits and lines)."""
        groups = kept.groups
        holders = groups.get(group)
        if holders is None:
            own = [job]
            holders = groups[group] = {job.user: own}
            _inner(kept.by_team, group.team)[group] = holders
            kept.by_need.setdefault(group.need, []).append(group)
            if sort:
                self._line(kept, job).put(group, job, own)
            return
        if not holders:  # kept empty since its last job left (``remove``): taken up again
            self._idle_groups -= 1
        got = holders.get(job.user)
        if got is None:
            own = holders[job.user] = [job]
            if sort:
                self._line(kept, job).put(group, job, own)
            return
        own = got
        first = own[0]
        _insert(own, job, sort)
        if sort and own[0] is job:  # it is now the user's oldest in the group
            line = self._line(kept, job)
            line.drop(group, first)
            line.put(group, job, own)

    def remove(self, job_id: str) -> Job:
        """Take ``job_id`` out of the queue (placed, cancelled); KeyError when not queued."""
        job = self.jobs[job_id]  # get and del, not pop: a compiled build has both natively
        del self.jobs[job_id]
        group = self.groups[job_id]
        del self.groups[job_id]
        if job.node_selector is not EMPTY:  # most have none: no iterator made for them
            for label in job.node_selector:
                _decrement(self.label_keys, label)
        if job.model:
            _decrement(self.models, job.model)
        batch = None if job.batch_key is None else batch_key(job)
        if batch is not None:
            _remove(self.batches, batch, job)
        if len(self.unknown) and job_id in self.unknown:  # a set's size: read natively
            self.unknown.discard(job_id)
            return job
        kept = self._kept[job.priority]
        if self._is_big(group.need, job.replicas):
            _remove_from(kept.big, job)
            _decrement(kept.big_teams, job.team)
        groups = kept.groups
        holders = groups[group]
        own = holders[job.user]
        first = own[0] is job
        if len(own) == 1 and first:  # its last job here: the list goes whole, not emptied
            del holders[job.user]
            self._relined(kept, job, group, None)
        else:
            _remove_from(own, job)
            if first:  # the user's oldest in the group: its place in the user's line moves
                self._relined(kept, job, group, own)
        if not holders:
            # The group's last job of the class left. It stays, with no job, for its next
            # job: about half of all removals emptied a group on a generated trace, and its
            # next job made it again, in its class's lists and both splits. Passes pass
            # over a group with no job; past ``IDLE_GROUPS`` more of them than queued
            # jobs, they are swept out.
            self._idle_groups += 1
            if self._idle_groups > IDLE_GROUPS + len(self.jobs):
                self._sweep_groups()
        return job

    def _line(self, kept: ClassMaps, job: Job) -> Line[Group]:
        """The line of ``job``'s user in its class and team (made when missing)."""
        users = _inner_lines(kept.lines, job.team)
        line = users.get(job.user)
        if line is None:
            line = users[job.user] = Line()
        elif not line.places:  # kept empty since the user's last job left: taken up again
            self._idle -= 1
        return line

    def _relined(self, kept: ClassMaps, job: Job, group: Group, own: list[Job] | None) -> None:
        """``job``, the first of its user's jobs in ``group``, left; ``own``: the rest."""
        users = kept.lines[job.team]
        line = users[job.user]
        if own:
            line.move(group, job, own[0])
            return
        line.drop(group, job)
        if line.places:
            return
        # The user's last job of the class and team left. Its line stays, empty, for the
        # user's next job: a user's few queued jobs come and go, and a line (with its
        # lists) was made and freed about once per two jobs on a generated trace. The state
        # a pass left on it goes: kept, its slots held lists and jobs long gone, and at
        # 1,000,000 jobs the maps of slots grew cold (about 7% slower). Passes skip empty
        # lines; past ``IDLE_LINES`` more empty ones than queued jobs, they are swept out.
        line.forget()
        self._idle += 1
        if self._idle > IDLE_LINES + len(self.jobs):
            self._sweep()

    def _sweep(self) -> None:
        """Drop every empty line (``_relined``: each let go of its pass state as it emptied,
        and a pass takes up no empty line)."""
        for by_team in self.lines.values():
            for team in list(by_team):
                users = by_team[team]
                for user in [u for u, line in users.items() if not line.places]:
                    del users[user]
                if not users:
                    del by_team[team]
        self._idle = 0

    def _sweep_groups(self) -> None:
        """Drop every group with no job from its class's lists and splits."""
        for kept in self._kept.values():
            groups = kept.groups
            for group in [g for g, holders in groups.items() if not holders]:
                del groups[group]
                _forget(kept, group)
        self._idle_groups = 0

    def sort(self) -> None:
        """Sort every list after ``add(..., sort=False)`` calls."""
        for groups in self.lists.values():
            for holders in groups.values():
                for own in holders.values():
                    own.sort(key=job_key)
        for batch in self.batches.values():
            batch.sort(key=job_key)
        for big in self.big.values():
            big.sort(key=job_key)
        for cls, by_team in self.by_team.items():  # the lines afresh, from the sorted lists
            lines = self.lines[cls]  # refilled, not replaced: ``ClassMaps`` holds it
            for users in lines.values():
                for line in users.values():
                    line.forget()
            lines.clear()
            for team, team_groups in by_team.items():
                lines[team] = lines_of(team_groups)
        self._idle = 0  # the lines afresh: none empty

    def stamp(self) -> i64:
        """A number never handed out before: marks what a pass noted on its groups."""
        self._stamps += 1
        return self._stamps

    def _is_big(self, need: Need, replicas: int) -> bool:
        return self.big_gpus is not None and need.gpus * replicas >= self.big_gpus

    def need(self, job: Job) -> Need:
        """``need_of(job)``, shared by jobs with equal requests (the common case)."""
        if job.node_selector is not EMPTY or job.backend is not None:
            return need_of(job)
        r = job.resources
        # Jobs often share one request object (a trace's shapes, a batch's copies): found
        # by identity first, without hashing the request's six fields: among the first
        # few requests seen by a scan (no int boxed for ``id`` and hashed), then by id.
        # The entries hold the request, so no other object can take its id while cached.
        for seen, known in self._recent:
            if seen is r:
                return known
        same = self._by_request.get(id(r))
        if same is not None:
            return same[1]
        need = self._needs.get(r)
        if need is None:
            if len(self._needs) >= NEED_CACHE:
                self._needs.clear()
            need = self._needs[r] = need_of(job)
        if len(self._recent) < RECENT_REQUESTS:
            self._recent.append((r, need))
            return need
        if len(self._by_request) >= NEED_CACHE:
            self._by_request.clear()
        self._by_request[id(r)] = (r, need)
        return need


def _forget(kept: ClassMaps, group: Group) -> None:
    """``group`` has no job left in ``kept``'s class: out of the kept splits too."""
    by_team = kept.by_team
    own = by_team[group.team]
    del own[group]
    if not own:
        del by_team[group.team]
    by_need = kept.by_need
    alike = by_need[group.need]
    for i, other in enumerate(alike):  # by identity: ``list.remove`` compares generically
        if other is group:
            alike.pop(i)  # not ``del``: a compiled build pops natively, deletes generically
            break
    if not alike:
        del by_need[group.need]


def _inner(outer: dict[str, dict[Group, Holders]], key: str) -> dict[Group, Holders]:
    inner = outer.get(key)
    if inner is None:
        inner = outer[key] = {}
    return inner


def _inner_lines(outer: dict[str, dict[str, Line[Group]]], key: str) -> dict[str, Line[Group]]:
    inner = outer.get(key)
    if inner is None:
        inner = outer[key] = {}
    return inner


def _insert(own: list[Job], job: Job, sort: bool) -> None:
    last = own[-1] if own else None
    if not sort or last is None or _not_after(last, job):
        own.append(job)
    else:
        insort(own, job, key=job_key)


def _not_after(a: Job, b: Job) -> bool:
    """``job_key(a) <= job_key(b)``, field by field: no two tuples made and compared."""
    if a.submitted_at != b.submitted_at:
        return a.submitted_at < b.submitted_at
    return a.id <= b.id


def _remove(lists: dict[HK, list[Job]], key: HK, job: Job) -> None:
    own = lists[key]
    if len(own) == 1 and own[0] is job:  # its last job: the list goes whole, not emptied
        del lists[key]
        return
    _remove_from(own, job)
    if not own:
        del lists[key]


def _remove_from(own: list[Job], job: Job) -> None:
    # ``pop``, not ``del``: a compiled build pops from a list natively, deletes generically
    if own and own[0] is job:  # the usual case: jobs leave oldest first
        own.pop(0)
        return
    # ``bisect_left(own, job_key(job), key=job_key)``, written out: the generic bisect
    # called the key function, a tuple made, at each step (about 1,500 instructions a job)
    at, hi = 0, len(own)
    while at < hi:
        mid = (at + hi) // 2
        if _not_after(job, own[mid]):
            hi = mid
        else:
            at = mid + 1
    if at < len(own) and own[at] is job:
        own.pop(at)
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
