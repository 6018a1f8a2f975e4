"""The allocation a placement becomes once its shell starts it.

A ``Placement`` says where and on which cards; the allocation adds who runs
there (team, user, priority class and whether it may be preempted), taken from
the placement's first job: a batch's jobs and a gang's replicas share them.
The server, the simulator and the ETA forecast all start placements this way.
"""

from __future__ import annotations

from corral.core.model import Allocation, Job
from corral.core.states import AllocObserved
from corral.scheduler.api import Placement


def allocation_of(
    p: Placement,
    job: Job,
    *,
    id: str,
    attempt: int = 1,
    started_at: float = 0.0,
    observed: AllocObserved = AllocObserved.PENDING,
    preemptible: bool | None = None,
) -> Allocation:
    """The allocation ``id`` for placement ``p``, whose first job is ``job`` (``preemptible``
    None: as the job says)."""
    return Allocation(
        id=id,
        job_ids=p.job_ids,
        node=p.node,
        team=job.team,
        user=job.user,
        priority=job.priority,
        replica=p.replica,
        gpu_indices=p.gpu_indices,
        gpu_milli=p.gpu_milli,
        vram_bytes=p.vram_bytes,
        cpus=p.cpus,
        on_cpu=p.on_cpu,
        memory_bytes=p.memory_bytes,
        preemptible=job.preemptible if preemptible is None else preemptible,
        borrowed=p.borrowed,
        attempt=attempt,
        started_at=started_at,
        observed=observed,
    )
