"""Gangs: all replicas of a job placed at once, or none.

A gang (``Job.replicas > 1``, e.g. multi-node training) is placed on the
working copy and rolled back by the caller when it does not fit whole. It
goes on as few nodes as possible: nodes are taken most room first, and the
last one is the tightest node that holds the remainder (best fit, so whole
free nodes stay whole). With ``Job.gang_label`` (say ``rack``), a set of
nodes sharing one value of that label is preferred; the gang spans values
only when no single value has room.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from corral.scheduler.capacity import NodeCap
from corral.scheduler.cycle import Cycle
from corral.scheduler.fit import Fit, fit_on, slots
from corral.scheduler.need import Need

Choice = list[tuple[NodeCap, int]]
"""Nodes and how many replicas each gets."""


def place_gang(cycle: Cycle, need: Need, replicas: int, label: str | None) -> list[Fit] | None:
    """Reserve every replica on the working copy; ``None`` (with partial work) if it cannot.

    The caller checkpoints before and rolls back on ``None``.
    """
    room = _room(cycle, need, replicas)
    choice = _choose(room, replicas, label)
    if choice is None:
        return None
    fits: list[Fit] = []
    for nc, count in choice:
        for _ in range(count):
            fit = fit_on(nc, need)
            if fit is None:  # slots() promised room; a mismatch is a bug, not a placement
                return None
            cycle.take(fit)
            fits.append(fit)
    return fits


def _room(cycle: Cycle, need: Need, replicas: int) -> list[tuple[NodeCap, int]]:
    """Every statically feasible node with room for at least one replica now.

    Whole-card and CPU-only needs read the capacity index (only nodes with free
    cards or CPUs); shared-card needs look at every feasible node.
    """
    feasible = cycle.feasible_classes(need)
    if need.gpus or need.cpu_only:
        allowed = set(feasible)
        index = cycle.cap.everywhere
        buckets = index.whole[need.gpus :] if need.gpus else index.cpu
        candidates = [nc for bucket in buckets for nc in bucket if nc.cls in allowed]
    else:
        nodes = cycle.cap.nodes
        candidates = [nodes[idx] for cls in feasible for idx in cycle.class_members[cls]]
    found = []
    for nc in candidates:
        if nc.hidden or not nc.schedulable:
            continue  # reserved for a job ahead, or taking no new work
        count = slots(nc, need, replicas)
        if count > 0:
            found.append((nc, count))
    return found


def _choose(room: list[tuple[NodeCap, int]], replicas: int, label: str | None) -> Choice | None:
    """Fewest nodes, in one label group when possible."""
    if label is not None:
        groups: dict[str, list[tuple[NodeCap, int]]] = defaultdict(list)
        for nc, count in room:
            value = nc.node.labels.get(label)
            if value is not None:
                groups[value].append((nc, count))
        best: tuple[tuple[int, int, str], Choice] | None = None
        for value in sorted(groups):
            picked = _fewest_nodes(groups[value], replicas)
            if picked is not None:
                key = (len(picked), _leftover(picked), value)
                if best is None or key < best[0]:
                    best = (key, picked)
        if best is not None:
            return best[1]
    return _fewest_nodes(room, replicas)


def _fewest_nodes(room: Sequence[tuple[NodeCap, int]], replicas: int) -> Choice | None:
    """Greedy most-room-first, then the tightest node for the remainder."""
    if sum(count for _, count in room) < replicas:
        return None
    ordered = sorted(room, key=lambda item: (-item[1], item[0].whole_free, item[0].idx))
    chosen: Choice = []
    left = replicas
    for nc, count in ordered:
        if left <= 0:
            break
        chosen.append((nc, min(count, left)))
        left -= count
    last_nc, last_count = chosen[-1]
    used = {nc.idx for nc, _ in chosen}
    last_room = _room_of(room, last_nc)  # once, not once per node (it was O(nodes^2))
    tighter = [
        (nc, count)
        for nc, count in room
        if nc.idx not in used and count >= last_count and count < last_room
    ]
    if tighter:
        nc, _ = min(tighter, key=lambda item: (item[1], item[0].whole_free, item[0].idx))
        chosen[-1] = (nc, last_count)
    return chosen


def _room_of(room: Sequence[tuple[NodeCap, int]], target: NodeCap) -> int:
    return next(count for nc, count in room if nc is target)


def _leftover(choice: Choice) -> int:
    return sum(nc.whole_free for nc, _ in choice)
