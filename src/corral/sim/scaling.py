"""The autoscaler in the simulator: the server's autoscale loop and a provider, on virtual time.

A scenario with ``pools`` runs the same pure ``autoscale(request) -> Reply``
the server's loop (``server/loops/autoscale.py``) runs, every
``autoscale.tick_s`` simulated seconds, gathering the same facts:

* the members (machines launched and not removed), and the nodes;
* which nodes hold allocations (``Busy``, told every allocation start and end),
  and since when each member's node is idle: set at the first decision that
  sees it idle, forgotten when it has work, as the server does;
* pending work: the jobs the last scheduling cycle left unplaced, with their
  reason codes, each waiting since the first decision that saw it unplaced
  (so a job opens a machine at the first decision ``scale_up_delay_s`` after
  that one, as on the server);
* the members it drained itself, and the pools' back-off.

It carries the reply out as the server does: a drain marks the node draining
(no new work), an undrain clears it, a removal deletes the member and its
node (a node that still holds work stays), and a launch makes members named
``<pool>-<n>`` (a counter per pool: nothing random) whose nodes, shaped as the
pool says, join ``boot_s`` later. Nothing sleeps: decisions and joins are
times the runner jumps to. Between decisions that can change nothing (the
reply was idle, no machine is booting, no idle or waiting clock will run out)
the autoscaler sleeps until the world changes, so a quiet cluster costs no
decisions and a run still ends when nothing more can happen.

A scenario without pools never builds any of this (``runner.py``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from corral.autoscaler import Member, Pending, Pool, Reply, Request, autoscale
from corral.autoscaler.clocks import Clocks
from corral.core.model import Allocation, Gpu, Job, Node, Team
from corral.core.states import JobState
from corral.scheduler.api import Unplaced
from corral.sim.fields import default_memory
from corral.sim.observing import Observer, Observing, observing
from corral.sim.scenario import Scenario
from corral.sim.world import World

HOUR_S = 3600.0


class Busy(Observing):
    """The world's observer when a scenario autoscales: counts allocations per node (for
    ``Request.busy``) and passes every change on to the policy."""

    def __init__(self, policy: Observer) -> None:
        self.policy = observing(policy)  # called directly when it is an ``Observing``
        self.on_node: dict[str, int] = {}  # node -> active allocations there
        self._node_of: dict[str, str] = {}  # allocation -> its node

    def submitted(self, job: Job) -> None:
        self.policy.submitted(job)

    def withdrawn(self, job_id: str) -> None:
        self.policy.withdrawn(job_id)

    def started(self, alloc: Allocation, expected_end: float | None) -> None:
        self.policy.started(alloc, expected_end)
        self._node_of[alloc.id] = alloc.node
        self.on_node[alloc.node] = self.on_node.get(alloc.node, 0) + 1

    def ended(self, alloc_id: str) -> None:
        self.policy.ended(alloc_id)
        node = self._node_of.pop(alloc_id)
        left = self.on_node[node] - 1
        if left:
            self.on_node[node] = left
        else:
            del self.on_node[node]

    def reflagged(self, alloc_id: str, borrowed: bool) -> None:
        self.policy.reflagged(alloc_id, borrowed)

    def teams_changed(self, teams: tuple[Team, ...]) -> None:
        self.policy.teams_changed(teams)

    def nodes_changed(self, nodes: tuple[Node, ...]) -> None:
        self.policy.nodes_changed(nodes)


@dataclass(slots=True)
class Life:
    """One autoscaled node's time in the cluster: from joining until removed (or the end)."""

    pool: Pool
    joined: float
    left: float | None = None

    def span(self, start: float, end: float) -> float:
        """Seconds it was in the cluster between ``start`` and ``end``."""
        stop = end if self.left is None else min(self.left, end)
        return max(0.0, stop - max(start, self.joined))


class Scaling:
    """The simulated autoscale loop and provider; the runner calls ``joins``, ``tick``."""

    def __init__(self, scenario: Scenario, world: World, busy: Busy) -> None:
        self.pools = {p.name: p for p in scenario.pools}
        self.settings = scenario.autoscaling
        self.world = world
        self.busy = busy
        self.members: dict[str, Member] = {}
        self.booting: deque[tuple[float, str]] = deque()  # (joins at, member): launch order
        self.lives: dict[str, Life] = {}  # joined members' nodes
        self.ended: list[Life] = []
        self.clocks = Clocks()  # since when members are idle and jobs wait, as the server's
        self.backoff: dict[str, float] = {}
        self.draining: set[str] = set()
        self.unplaced: tuple[Unplaced, ...] = ()  # of the last scheduling cycle
        self._counter = dict.fromkeys(self.pools, 0)
        self._tick: int | None = 0  # the next decision is at _tick x tick_s; None: asleep
        self.static_gpus = scenario.total_gpus
        self.gpus_now = self.peak_gpus = self.static_gpus
        self.peak_nodes = 0
        self.launched = 0
        self.removed = 0
        self.decisions = 0
        self.changed_at = 0.0  # when the world or the autoscaler last changed anything

    def next_time(self) -> float | None:
        """When the next decision or join is due (None: asleep and nothing booting)."""
        tick = None if self._tick is None else self._tick * self.settings.tick_s
        join = self.booting[0][0] if self.booting else None
        if tick is None or (join is not None and join < tick):
            return join
        return tick

    def wake(self, now: float) -> None:
        """The world changed at ``now``: decide again at the first tick from now on."""
        self.changed_at = now
        if self._tick is None:
            k = math.ceil(now / self.settings.tick_s)
            self._tick = k if k * self.settings.tick_s >= now else k + 1  # float rounding

    def joins(self, now: float) -> bool:
        """Members whose boot time has come join as nodes; True when any did."""
        joined: list[Node] = []
        while self.booting and self.booting[0][0] <= now:
            _, name = self.booting.popleft()
            member = self.members.get(name)
            if member is not None:  # not removed while it booted
                joined.append(self._join(member, now))
        if joined:
            self.world.set_nodes(self.world.nodes + tuple(joined))
        return bool(joined)

    def tick(self, now: float) -> bool:
        """Decide and carry out the reply when a decision is due; True when nodes changed."""
        if self._tick is None or self._tick * self.settings.tick_s > now:
            return False
        request = self._request(now)
        reply = autoscale(request)
        self.decisions += 1
        self.backoff = dict(reply.backoff)
        changed = self._apply(now, reply)
        if not reply.idle:
            self.changed_at = now
        self._tick = None if self._quiet(request, reply) else self._tick + 1
        return changed

    def capacity_gpu_s(self, start: float, end: float) -> float:
        """GPU-seconds the autoscaled nodes were in the cluster between ``start`` and ``end``."""
        return sum(life.pool.gpus * life.span(start, end) for life in self._lives())

    def summary(self, end: float) -> dict[str, Any]:
        """The report's ``summary.autoscaler`` (docs/sim.md, "Autoscaling")."""
        hours = {name: 0.0 for name in self.pools}
        for life in self._lives():
            hours[life.pool.name] += life.span(life.joined, end) / HOUR_S
        cost = sum(h * self.pools[p].cost_per_hour for p, h in hours.items())
        return {
            "launched": self.launched,
            "removed": self.removed,
            "nodes_at_end": len(self.members),
            "peak_nodes": self.peak_nodes,
            "node_hours": {p: round(h, 6) for p, h in hours.items()},
            "cost": round(cost, 6),
            "decisions": self.decisions,
        }

    # -- gathering the facts ---------------------------------------------------------

    def _request(self, now: float) -> Request:
        nodes = {n.name: n for n in self.world.nodes}
        busy = self.busy.on_node
        return Request(
            now=now,
            pools=tuple(self.pools.values()),
            members=tuple(self.members.values()),
            nodes=nodes,
            busy=frozenset(busy),
            idle_since=self.clocks.idle(self.lives, busy, now),  # members' idleness only
            draining=frozenset(self.draining),
            pending=self._pending(now),
            backoff=self.backoff,
            config=self.settings.config,
        )

    def _pending(self, now: float) -> tuple[Pending, ...]:
        """The last cycle's unplaced jobs still queued, as the server's loop gathers them."""
        runs = self.world.runs
        unplaced = sorted(self.unplaced, key=lambda u: u.position)
        waiting = (
            (run.job, frozenset(str(r.code) for r in u.reasons))
            for u in unplaced
            if (run := runs.get(u.job_id)) is not None and run.state is JobState.QUEUED
        )
        return self.clocks.pending(waiting, now)

    # -- carrying out the reply ------------------------------------------------------

    def _apply(self, now: float, reply: Reply) -> bool:
        nodes = {n.name: n for n in self.world.nodes}
        before = len(nodes)
        for name in reply.drain:
            if name in nodes:
                nodes[name] = replace(nodes[name], draining=True)
                self.draining.add(name)
        for name in reply.undrain:
            if name in nodes:
                nodes[name] = replace(nodes[name], draining=False)
                self.draining.discard(name)
        for removal in reply.remove:
            self._remove(removal.name, nodes, now)
        for launch in reply.launches:
            self._launch(self.pools[launch.pool], launch.count, now)
        changed = bool(reply.drain or reply.undrain) or len(nodes) != before
        if changed:
            self.world.set_nodes(tuple(nodes.values()))
        return changed

    def _remove(self, name: str, nodes: dict[str, Node], now: float) -> None:
        """Terminate member ``name``; its node leaves with it unless it still has work."""
        if name not in self.members or name in self.busy.on_node:
            return  # gone already, or busy: the next decision sees it
        del self.members[name]
        self.removed += 1
        self.draining.discard(name)
        life = self.lives.pop(name, None)
        if life is None:
            return  # never joined: its join is dropped when due
        life.left = now
        self.ended.append(life)
        del nodes[name]
        self.gpus_now -= life.pool.gpus

    def _launch(self, pool: Pool, count: int, now: float) -> None:
        for _ in range(count):
            name = self._name(pool.name)
            self.members[name] = Member(name, pool.name, now)
            self.booting.append((now + self.settings.boot_s, name))
            self.launched += 1

    def _name(self, pool: str) -> str:
        """``<pool>-<n>``, skipping names a fixed node already has."""
        taken = self.world.nodes
        while True:
            self._counter[pool] += 1
            name = f"{pool}-{self._counter[pool]}"
            if not any(n.name == name for n in taken):
                return name

    def _join(self, member: Member, now: float) -> Node:
        pool = self.pools[member.pool]
        self.lives[member.name] = Life(pool, now)
        self.gpus_now += pool.gpus
        self.peak_gpus = max(self.peak_gpus, self.gpus_now)
        self.peak_nodes = max(self.peak_nodes, len(self.lives))
        return node_of(pool, member.name, now)

    def _quiet(self, request: Request, reply: Reply) -> bool:
        """True when only a change in the world could make the next decision differ: the
        reply was idle, nothing boots, and no idle, waiting or back-off clock runs out."""
        if not reply.idle or self.booting:
            return False
        cfg, now = request.config, request.now
        clocks = [since + cfg.idle_s for since in request.idle_since.values()]
        clocks += [p.since + cfg.scale_up_delay_s for p in request.pending]
        clocks += list(reply.backoff.values())
        return all(t <= now for t in clocks)

    def _lives(self) -> list[Life]:
        return self.ended + list(self.lives.values())


def node_of(pool: Pool, name: str, now: float) -> Node:
    """The node a member of ``pool`` joins as: the pool's shape, ready, with a scenario
    node's default memory (a pool does not say; its real agents would report theirs)."""
    gpus = tuple(Gpu(i, pool.gpu_model, pool.vram_bytes) for i in range(pool.gpus))
    return Node(
        name,
        gpus=gpus,
        cpus=pool.cpus,
        labels=pool.labels,
        backends=pool.backends,
        last_seen=now,
        memory_bytes=default_memory(pool.gpus),
    )
