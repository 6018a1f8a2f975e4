"""``autoscale(request) -> Reply``: which machines to start and which to stop (docs/autoscaler.md).

One decision, in order:

1. **Broken members go.** A member whose agent has not joined within
   ``boot_timeout_s`` is removed and its pool backs off for ``backoff_s`` (the
   provider may be out of that machine); a member whose node has been lost for
   ``lost_s`` is removed (its work was requeued when it was lost).
2. **Pending work is packed** (``packing.py``) onto what is coming: members still
   booting (launches in flight, listed or not: ``ledger.fleet``) and idle
   members first, then new machines of the pool that fits cheapest per GPU
   (per machine for work without GPUs),
   within ``max_nodes``, the pool's and the overall spend cap (cost per hour of
   the whole fleet, in flight included) and ``max_launch``. Only work that has waited
   ``scale_up_delay_s`` may open a machine, and only work that more capacity
   could help (not a team at its quota, a retry's back-off, a job waiting for a
   node with its model), and only work of the ``priorities`` classes when
   that is set (free work may use machines paid work started, never start
   one). Work that waited less may still keep an idle member.
3. **Pools are topped up** to ``min_nodes``, within the spend caps (a cap is
   never passed, not even for the floor).
4. **Idle members are drained, then removed**: a member idle for ``idle_s``
   that no pending work needs is drained (no new work), and removed at the
   next decision if it is still empty; if work comes back first, it is
   undrained instead. Never below ``min_nodes``, at most ``max_remove`` per
   decision.

Machines that are no pool's member are never touched, nor members a person
paused or drained, nor the machines of a ``fixed`` pool (ones you run: they
count as room for waiting work when joined and idle, and are never started,
drained or removed).
"""

from __future__ import annotations

from corral.autoscaler.api import Launch, Member, Pool, Removal, Reply, Request, Unmet
from corral.autoscaler.packing import SPEND_SLACK, Machine, Packing, fits
from corral.core.model import Node
from corral.core.states import NodeState

_NOT_PAYING = "its priority class {} starts no machine (not in autoscale.priorities)"
NO_HELP = frozenset({"quota_exceeded", "not_before", "unknown_priority", "model_wait"})
"""Reason codes more machines cannot help (scheduler ``ReasonCode`` values)."""


def autoscale(request: Request) -> Reply:
    pools = {p.name: p for p in request.pools}
    backoff = {p: t for p, t in request.backoff.items() if t > request.now}
    removals, alive = _broken(request, backoff)
    counts = {p.name: 0 for p in request.pools}  # the members that serve
    for m in alive:
        counts[m.pool] = counts.get(m.pool, 0) + 1
    going = [m for m in request.members if m.name in request.leaving]
    packing, unmet = _pack(request, alive, going, pools, counts, backoff)
    opened = packing.opened()
    launches = [Launch(p, n, _why_launch(request, packing.served[p])) for p, n in opened.items()]
    launches += _top_up(request, counts, opened, backoff, packing)
    rescued = packing.rescued()
    drain, idle_removals, keep = _scale_down(request, alive, pools, counts, rescued)
    return Reply(
        launches=tuple(launches),
        drain=tuple(drain),
        undrain=tuple(sorted(request.draining & (rescued | keep))),
        remove=tuple(removals + idle_removals),
        backoff=backoff,
        unmet=tuple(unmet),
    )


def _broken(request: Request, backoff: dict[str, float]) -> tuple[list[Removal], list[Member]]:
    """Members to remove because they never joined or are lost; the rest are alive."""
    cfg, now = request.config, request.now
    removals: list[Removal] = []
    alive: list[Member] = []
    fixed = {p.name for p in request.pools if p.fixed}
    for m in request.members:
        node = request.nodes.get(m.name)
        if m.name in request.leaving:
            continue  # terminated already: the provider's list has not caught up
        if m.pool in fixed and (node is None or node.state is NodeState.LOST):
            continue  # not there now, and not the autoscaler's to replace
        if node is None and now - m.launched_at >= cfg.boot_timeout_s:
            why = f"its agent did not join within {cfg.boot_timeout_s:g}s"
            removals.append(Removal(m.name, m.pool, why, "not_joined"))
            backoff[m.pool] = now + cfg.backoff_s
        elif node is not None and _lost_for(node, now) >= cfg.lost_s:
            why = f"its node was lost for {cfg.lost_s:g}s"
            removals.append(Removal(m.name, m.pool, why, "lost"))
        else:
            alive.append(m)
    return removals, alive


def _lost_for(node: Node, now: float) -> float:
    return now - node.last_seen if node.state is NodeState.LOST else -1.0


def _pack(
    request: Request,
    alive: list[Member],
    going: list[Member],
    pools: dict[str, Pool],
    counts: dict[str, int],
    backoff: dict[str, float],
) -> tuple[Packing, list[Unmet]]:
    cfg, now = request.config, request.now
    held = dict(counts)  # what runs or still costs: machines on their way out count too
    for m in going:
        held[m.pool] = held.get(m.pool, 0) + 1
    room = {p.name: 0 if p.name in backoff else _room(p, held[p.name]) for p in request.pools}
    budget = None
    if cfg.max_spend_per_hour is not None:
        costing = (m for m in [*alive, *going] if m.pool in pools)
        budget = cfg.max_spend_per_hour - sum(pools[m.pool].cost_per_hour for m in costing)
    packing = Packing(room, cfg.max_launch, budget)
    for m in alive:
        if _can_take_work(request, m):
            packing.supply(Machine.empty(pools.get(m.pool) or _gone(m.pool), m.name))
    # Stable sorts: ties keep the order given.
    by_gpu = sorted(request.pools, key=per_gpu)
    by_machine = sorted(request.pools, key=lambda p: p.cost_per_hour)
    unmet: list[Unmet] = []
    for pending in request.pending:
        if pending.reasons & NO_HELP:
            continue
        job = pending.job
        by_cost = by_gpu if job.resources.wants_gpu else by_machine
        verdicts = {p.name: fits(p, job) for p in by_cost}  # None: its machines fit the job
        fitting = [p for p in by_cost if verdicts[p.name] is None]
        if not fitting:
            whys = "; ".join(filter(None, verdicts.values())) or "no pools"
            unmet.append(Unmet(job.id, f"no pool's machines fit it: {whys}"))
            continue
        waited = now - pending.since >= cfg.scale_up_delay_s
        paying = not cfg.priorities or job.priority in cfg.priorities
        static = {name: why is None for name, why in verdicts.items()}
        why = packing.place(job, fitting if waited and paying else [], static)
        if why is not None and waited:
            unmet.append(Unmet(job.id, why if paying else _NOT_PAYING.format(job.priority)))
    return packing, unmet


def per_gpu(pool: Pool) -> tuple[float, float]:
    """What a pool's machine costs per GPU it brings (per machine for CPU-only pools), then
    per machine: GPU work runs where GPUs are cheapest, and between equal prices on the
    smaller machine, which strands less. Work without GPUs goes to the cheapest machine."""
    return pool.cost_per_hour / max(pool.gpus, 1), pool.cost_per_hour


def _room(pool: Pool, count: int) -> int:
    """Machines ``pool`` may still open: within ``max_nodes`` and its own spend cap."""
    if pool.fixed:
        return 0
    room = pool.max_nodes - count
    cap, cost = pool.max_spend_per_hour, pool.cost_per_hour
    if cap is not None and cost > 0:
        room = min(room, int((cap + SPEND_SLACK) // cost) - count)
    return max(room, 0)


def _why_launch(request: Request, jobs: set[str]) -> str:
    """'3 jobs waited 45 s': how much work a launch is for, and the longest it waited."""
    since = [p.since for p in request.pending if p.job.id in jobs]
    waited = request.now - min(since) if since else 0.0
    return f"{len(jobs)} job{'s' * (len(jobs) != 1)} waited {waited:.0f} s"


def _can_take_work(request: Request, m: Member) -> bool:
    """Booting, or joined, ready and idle (and not paused or drained by a person)."""
    return m.name not in request.nodes or _idle(request, m)


def _gone(name: str) -> Pool:
    """A pool no longer configured: its members take no new launches and go when idle."""
    return Pool(name, max_nodes=0)


def _top_up(
    request: Request,
    counts: dict[str, int],
    opened: dict[str, int],
    backoff: dict[str, float],
    packing: Packing,
) -> list[Launch]:
    launches: list[Launch] = []
    for pool in request.pools:
        if pool.fixed:
            continue
        short = pool.min_nodes - counts[pool.name] - opened.get(pool.name, 0)
        n = 0
        while n < short and packing.limit > 0 and packing.room.get(pool.name, 0) > 0:
            if pool.name in backoff or not packing.affords(pool):
                break
            packing.spend(pool)
            packing.room[pool.name] -= 1
            packing.limit -= 1
            n += 1
        if n > 0:
            launches.append(Launch(pool.name, n, f"{n} to reach min_nodes {pool.min_nodes}"))
    return launches


def _scale_down(
    request: Request,
    alive: list[Member],
    pools: dict[str, Pool],
    counts: dict[str, int],
    rescued: set[str],
) -> tuple[list[str], list[Removal], set[str]]:
    """Idle members to drain now, drained members still empty to remove, and drained
    members to keep after all (their pool is down to ``min_nodes``)."""
    cfg, now = request.config, request.now
    left = dict(counts)
    drain: list[str] = []
    removals: list[Removal] = []
    keep: set[str] = set()
    idle = sorted(
        (m for m in alive if _idle(request, m) and m.name not in rescued),
        key=lambda m: (request.idle_since.get(m.name, now), m.name),
    )
    for m in idle:
        if len(drain) + len(removals) >= cfg.max_remove:
            break
        pool = pools.get(m.pool) or _gone(m.pool)
        if pool.fixed:
            continue
        if left[m.pool] <= pool.min_nodes:
            if m.name in request.draining:
                keep.add(m.name)
            continue
        if m.name in request.draining:
            removals.append(Removal(m.name, m.pool, "idle, drained and still empty"))
        elif now - request.idle_since.get(m.name, now) >= cfg.idle_s:
            drain.append(m.name)
        else:
            continue
        left[m.pool] -= 1
    return drain, removals, keep


def _idle(request: Request, m: Member) -> bool:
    """Joined, ready and without work (and not paused or drained by a person)."""
    node = request.nodes.get(m.name)
    return (
        node is not None
        and node.state is NodeState.READY
        and m.name not in request.busy
        and (not node.draining or m.name in request.draining)
        and not node.paused
    )
