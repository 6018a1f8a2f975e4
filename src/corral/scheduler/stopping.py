"""The stop window: what a cycle should see while the victims of a preemption stop.

A placement that preempts is not applied at once: its victims get a grace period
to checkpoint and stop, and the job waits out of the queue meanwhile (the
server's ``services/placement.py``). Told as they stand - victims active but
flagged to stop, and nothing of the waiting job - a cycle would count the
victims' cards as their team's (a team giving back capacity would look over
its quota still, and lose more work) and see the free cards the waiting job was
promised as free (another job would take them, and the waiting one would evict
again when its victims had gone). Either way an eviction buys nothing.

So a shell holds, in place of each such placement's victims (``stop_window``):

* a **claim** per placement: the allocation the job will get, on the cards it
  was given, charged to its team and never evictable - what the simulator sees
  the instant it stops the victims;
* a **leftover** per victim allocation holding cards no claim on its node
  covers, with their memory, until the victim ends. It is charged to the
  waiting job's team, not the victim's: the victim's team is giving those cards
  back, and counting them as its own would make it a victim again. CPUs and host
  memory are the claims' only (a victim's are free once it stops).

The simulator stops victims at once and needs none of this; with it the two
see the same cluster, and the stop window costs the waiting job only its
length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.core.model import Allocation, Job
from corral.scheduler.allocation import allocation_of
from corral.scheduler.api import Placement

CLAIM: str = "claim:"
"""Prefix of a claim's allocation id (the placement's own follows)."""
LEFTOVER: str = "stopping:"
"""Prefix of a leftover's allocation id (the victim's own follows)."""


def stop_window(
    job: Job,
    placements: Sequence[Placement],
    victims: Mapping[str, Allocation],
    now: float,
) -> tuple[list[Allocation], dict[str, Allocation]]:
    """The claims of ``job``'s ``placements`` and the leftovers of its ``victims`` (by
    victim id; a victim wholly covered by claims has none), started at ``now``."""
    claims = [_claim(job, p, now) for p in placements]
    covered: dict[str, set[int]] = {}
    for claim in claims:
        covered.setdefault(claim.node, set()).update(claim.gpu_indices)
    leftovers: dict[str, Allocation] = {}
    for victim in victims.values():
        if victim.on_cpu:
            continue
        cards = tuple(g for g in victim.gpu_indices if g not in covered.get(victim.node, ()))
        if cards:
            leftovers[victim.id] = Allocation(
                id=LEFTOVER + victim.id,
                job_ids=placements[0].job_ids if placements else (job.id,),
                node=victim.node,
                team=job.team,
                user=job.user,
                priority=job.priority,
                gpu_indices=cards,
                gpu_milli=victim.gpu_milli,
                vram_bytes=victim.vram_bytes,
                preemptible=False,
                started_at=now,
            )
    return claims, leftovers


def _claim(job: Job, p: Placement, now: float) -> Allocation:
    return allocation_of(p, job, id=CLAIM + p.allocation_id, started_at=now, preemptible=False)
