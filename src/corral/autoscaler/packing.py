"""Pending work packed onto machines that are coming (or idle), to count what to launch.

Each pending job's replicas go first-fit onto the supply that is already
there (members still booting, idle members), then onto machines opened in
this decision, and only when none has room is a new machine of the cheapest
pool that fits opened, within the pool's ``max_nodes``. A gang is all or
nothing: its replicas are placed on a working copy and rolled back when one
does not fit (STYLE.md habit 6), so no machine is started for half a gang.

This is an estimate of capacity, not a placement: the scheduler still
decides where each job runs once the machines have joined.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from corral.autoscaler.api import Pool
from corral.core.model import Job
from corral.core.resources import MILLI, MILLI_CPU, ResourceRequest

SPEND_SLACK = 1e-9  # dollars per hour: a cap met exactly by float sums is met, not passed


@dataclass(slots=True)
class Machine:
    """A machine's free room in the estimate: per card (compute share, VRAM), and CPUs."""

    pool: Pool
    name: str | None  # a member's name; None for one this decision would launch
    cards: list[list[int]] = field(default_factory=list)
    cpus: int = 0  # milli-CPUs left
    used: bool = False

    @classmethod
    def empty(cls, pool: Pool, name: str | None) -> Machine:
        cards = [[MILLI, pool.vram_bytes] for _ in range(pool.gpus)]
        return cls(pool, name, cards, pool.cpus * MILLI_CPU)

    def copy(self) -> Machine:
        return Machine(self.pool, self.name, [card[:] for card in self.cards], self.cpus, self.used)

    def take(self, r: ResourceRequest) -> bool:
        """Reserve one replica's room here; False (and nothing changed) when it does not fit."""
        if r.cpu_milli > self.cpus:
            return False
        if r.gpus:
            whole = [c for c in self.cards if c[0] == MILLI and c[1] == self.pool.vram_bytes]
            if len(whole) < r.gpus:
                return False
            for taken in whole[: r.gpus]:
                taken[0] = taken[1] = 0
        elif r.shared:
            milli = r.milli_on(self.pool.vram_bytes)
            found = (c for c in self.cards if c[0] >= milli and c[1] >= r.vram_bytes)
            card = next(found, None)
            if card is None:
                return False
            card[0] -= milli
            card[1] -= r.vram_bytes
        self.cpus -= r.cpu_milli
        self.used = True
        return True


def fits(pool: Pool, job: Job) -> str | None:
    """None when one of ``pool``'s machines could ever run a replica of ``job``, else why not."""
    r = job.resources
    if r.cpu_milli > pool.cpus * MILLI_CPU:
        return f"needs {r.cpus:g} CPUs, {pool.name} has {pool.cpus}"
    if r.wants_gpu:
        if r.gpus > pool.gpus or not pool.gpus:
            n = max(r.gpus, 1)
            return f"needs {n} GPU{'s' * (n != 1)}, {pool.name} has {pool.gpus}"
        if r.gpu_models and pool.gpu_model not in r.gpu_models:
            return f"needs {'/'.join(sorted(r.gpu_models))}, {pool.name} has {pool.gpu_model}"
        if r.vram_bytes > pool.vram_bytes:
            return f"needs more VRAM per GPU than {pool.name}'s"
    for key, value in job.node_selector.items():
        if pool.labels.get(key) != value:
            return f"selector {key}={value} does not match {pool.name}'s labels"
    if job.backend and pool.backends and job.backend not in pool.backends:
        return f"needs backend {job.backend}, {pool.name} offers {', '.join(sorted(pool.backends))}"
    return None


class Packing:
    """The supply, the machines this decision opens, and how many each pool may still open."""

    def __init__(self, room: dict[str, int], limit: int, budget: float | None = None) -> None:
        self.machines: list[Machine] = []
        self.room = room  # pool -> machines it may still open (max_nodes - members, or 0)
        self.limit = limit  # machines this decision may open over all pools
        self.budget = budget  # cost per hour the overall spend cap still allows (None: no cap)
        self.served: dict[str, set[str]] = {}  # pool -> jobs packed onto its new machines
        # Per kind of need, the first machine that may still take it: machines only lose
        # room during a decision, so one that refused a need refuses it again. First fit then
        # costs about one look per job instead of one per machine (5,000 waiting jobs: 2.8 s
        # of the server's loop before, tens of milliseconds now).
        self.first: dict[Hashable, int] = {}

    def supply(self, machine: Machine) -> None:
        self.machines.append(machine)

    def place(self, job: Job, pools: list[Pool], static: dict[str, bool]) -> str | None:
        """Pack every replica of ``job``; None when done, else why not (nothing changed).

        ``static``: pool -> whether its machines could ever run the job (``fits``), as far
        as the caller knows; machines of other pools are asked once and added."""
        need = (job.resources, tuple(sorted(job.node_selector.items())), job.backend)
        if job.replicas == 1:  # one replica changes nothing unless it fits: no working copy
            return self._one(job, need, pools, static)
        kept = (
            [m.copy() for m in self.machines],
            dict(self.room),
            self.limit,
            self.budget,
            dict(self.first),
            {pool: set(jobs) for pool, jobs in self.served.items()},
        )
        for _ in range(job.replicas):
            why = self._one(job, need, pools, static)
            if why is not None:
                self.machines, self.room, self.limit, self.budget, self.first, self.served = kept
                return why
        return None

    def affords(self, pool: Pool) -> bool:
        """Whether the overall spend cap leaves room for one more machine of ``pool``."""
        return self.budget is None or pool.cost_per_hour <= self.budget + SPEND_SLACK

    def spend(self, pool: Pool) -> None:
        if self.budget is not None:
            self.budget -= pool.cost_per_hour

    def opened(self) -> dict[str, int]:
        """Machines to launch, per pool."""
        counts: dict[str, int] = {}
        for m in self.machines:
            if m.name is None:
                counts[m.pool.name] = counts.get(m.pool.name, 0) + 1
        return counts

    def rescued(self) -> set[str]:
        """Members the estimate put work on (a drained idle one must take work again)."""
        return {m.name for m in self.machines if m.name is not None and m.used}

    def _one(
        self, job: Job, need: Hashable, pools: list[Pool], static: dict[str, bool]
    ) -> str | None:
        r = job.resources
        machines = self.machines
        for i in range(self.first.get(need, 0), len(machines)):
            m = machines[i]
            ok = static.get(m.pool.name)
            if ok is None:
                ok = static[m.pool.name] = fits(m.pool, job) is None
            if ok and m.take(r):
                self.first[need] = i
                if m.name is None:
                    self.served.setdefault(m.pool.name, set()).add(job.id)
                return None
        self.first[need] = len(machines)
        if self.limit <= 0:
            return "the launch limit of one decision is reached; more next time"
        capped = False
        for pool in pools:
            if self.room.get(pool.name, 0) > 0:
                if not self.affords(pool):
                    capped = True
                    continue
                machine = Machine.empty(pool, None)
                if machine.take(r):
                    self.machines.append(machine)
                    self.room[pool.name] -= 1
                    self.limit -= 1
                    self.spend(pool)
                    self.served.setdefault(pool.name, set()).add(job.id)
                    return None
        if capped:
            return "the overall spend cap (autoscale.max_spend_per_hour) is reached"
        return "every pool that fits it is at max_nodes, its spend cap, or backing off"
