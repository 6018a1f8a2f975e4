"""Batching: compatible queued ``sample`` jobs share one allocation.

Image generation batches well: one model load, one pass over a batch of
prompts. Jobs are compatible when they are ``sample`` jobs with the same
``batch_key`` (the client's promise that backend, model and batchable
parameters agree), and the same priority class, team, resources, models and
backend (so quotas, placement and accounting stay exact). A job some nodes
refused for a model they lack never rides in another's batch. When the first of
them is placed, up to ``max_batch_size - 1`` others join its allocation,
oldest first; the plan lists them in ``Placement.job_ids``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence

from corral.core.model import Job, JobKind
from corral.scheduler.user_groups import job_key


def batch_key(job: Job) -> Hashable | None:
    """The compatibility key of ``job``, or ``None`` when it never batches."""
    if job.kind is not JobKind.SAMPLE or job.batch_key is None or job.gang:
        return None
    if job.lacking_nodes:  # it may not ride to every node its batch may go to
        return None
    models = (job.model, job.models) if job.models else job.model
    return (job.batch_key, job.priority, job.team, job.resources, models, job.backend)


class Batcher:
    """Queued batchable jobs by compatibility key, oldest first.

    Built from jobs, or over groups kept sorted by ``job_key`` between cycles
    (``Batcher.over``): a cycle only moves a cursor per group, never the lists.
    """

    def __init__(self, jobs: Iterable[Job], max_size: int) -> None:
        groups: dict[Hashable, list[Job]] = defaultdict(list)
        for job in jobs:
            key = batch_key(job)
            if key is not None:
                groups[key].append(job)
        for group in groups.values():
            group.sort(key=job_key)
        self._start(groups, max_size)

    @classmethod
    def over(cls, groups: Mapping[Hashable, Sequence[Job]], max_size: int) -> Batcher:
        batcher = cls((), max_size)
        batcher._groups = groups
        return batcher

    def _start(self, groups: Mapping[Hashable, Sequence[Job]], max_size: int) -> None:
        self._max = max(1, max_size)
        self._groups = groups
        self._cursor: dict[Hashable, int] = {}

    def followers(self, leader: Job, decided: set[str], now: float) -> tuple[Job, ...]:
        """Up to ``max_size - 1`` undecided jobs that may share ``leader``'s allocation,
        whose retry backoff is over at ``now``. A tuple: most jobs have no batch key, and
        the empty one is shared (no list made per placement)."""
        key = batch_key(leader)
        if key is None or self._max == 1:
            return ()
        group = self._groups.get(key, ())
        at = self._cursor.get(key, 0)
        taken: list[Job] = []
        while at < len(group) and len(taken) < self._max - 1:
            job = group[at]
            at += 1
            if job.id == leader.id or job.id in decided:
                continue
            if job.not_before <= now:
                taken.append(job)
        self._cursor[key] = at
        return tuple(taken)
