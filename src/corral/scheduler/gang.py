"""Gangs: all replicas of a job placed at once, or none.

A gang (``Job.replicas > 1``, e.g. multi-node training) is placed on the
working copy and rolled back by the caller when it does not fit whole. It
goes on as few nodes as possible: nodes are taken most room first, and the
last one is the tightest node that holds the remainder (best fit, so whole
free nodes stay whole). With ``Job.gang_label`` (say ``rack``), a set of
nodes sharing one value of that label is preferred; the gang spans values
only when no single value has room, and never when the label is required
(``Job.gang_label_required``).
"""

from __future__ import annotations

from collections import defaultdict

from corral.scheduler.cycle import Cycle
from corral.scheduler.fit import Fit, fit_on, slots
from corral.scheduler.need import Need
from corral.scheduler.node_cap import NodeCap

Choice = list[tuple[NodeCap, int]]
"""Nodes and how many replicas each gets."""


def place_gang(
    cycle: Cycle, need: Need, replicas: int, label: str | None, *, required: bool = False
) -> list[Fit] | None:
    """Reserve every replica on the working copy; ``None`` (with partial work) if it cannot.

    The caller checkpoints before and rolls back on ``None``.
    """
    room = _room(cycle, need, replicas, label)
    choice = _choose(room, replicas, label, required)
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


def _room(cycle: Cycle, need: Need, replicas: int, label: str | None) -> list[tuple[NodeCap, int]]:
    """Every statically feasible node with room for at least one replica now.

    Whole-card and CPU-only needs read the capacity index (only nodes with free
    cards or CPUs); shared-card needs look at every feasible node. A replica that
    takes every card of the largest nodes (a 2x8 gang on 8-card nodes) without a
    label: only the top bucket holds room, each node there one replica with the same
    free cards, so ``_fewest_nodes`` takes the first ``replicas`` of them in node
    order, and the walk stops once it has them.
    """
    feasible = cycle.feasible_classes(need)
    found: list[tuple[NodeCap, int]] = []
    if need.gpus or need.cpu_only:
        allowed = set(feasible)
        index = cycle.cap.everywhere
        buckets = index.whole[need.gpus :] if need.gpus else list(index.cpu)
        enough = replicas if need.gpus and len(buckets) == 1 and label is None else -1
        for bucket in buckets:
            nodes, i = bucket.nodes, bucket.next_at(0)
            while i >= 0:
                nc = nodes[i]
                i = bucket.next_at(i + 1)
                if nc.cls in allowed:
                    _count_room(nc, need, replicas, found)
                    if len(found) == enough:
                        return found
        return found
    nodes = cycle.cap.nodes
    for cls in feasible:
        for idx in cycle.class_members[cls]:
            _count_room(nodes[idx], need, replicas, found)
    return found


def _count_room(nc: NodeCap, need: Need, replicas: int, found: list[tuple[NodeCap, int]]) -> None:
    """Add ``nc`` and the replicas it holds now to ``found``, when it holds any."""
    if nc.hidden or not nc.schedulable:
        return  # reserved for a job ahead, or taking no new work
    count = slots(nc, need, replicas)
    if count > 0:
        found.append((nc, count))


def _choose(
    room: list[tuple[NodeCap, int]], replicas: int, label: str | None, required: bool
) -> Choice | None:
    """Fewest nodes, in one label group when possible (``required``: or not at all)."""
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
        if best is not None or required:
            return None if best is None else best[1]
    return _fewest_nodes(room, replicas)


def _fewest_nodes(room: list[tuple[NodeCap, int]], replicas: int) -> Choice | None:
    """Greedy most-room-first, then the tightest node for the remainder.

    Most room first means by (-count, whole_free, idx); the tightest node is the least by
    (count, whole_free, idx). Both orders are total (node indices are unique), so the
    nodes are picked by comparing integers in one walk each: no sort of every node with
    room (a gang looks at a few hundred of them and uses two).
    """
    total = 0
    for _, count in room:
        total += count
    if total < replicas:
        return None
    chosen: Choice = []
    left = replicas
    last_room = 0  # the room of the last node chosen
    for nc, count in _most_room(room, replicas):
        if left <= 0:
            break
        chosen.append((nc, min(count, left)))
        left -= count
        last_room = count
    last_count = chosen[-1][1]
    used = {nc.idx for nc, _ in chosen}
    tightest: tuple[NodeCap, int] | None = None
    for nc, count in room:
        if count < last_count or count >= last_room or nc.idx in used:
            continue
        if tightest is None or _tighter(nc, count, tightest[0], tightest[1]):
            tightest = (nc, count)
    if tightest is not None:
        chosen[-1] = (tightest[0], last_count)
    return chosen


def _most_room(room: list[tuple[NodeCap, int]], most: int) -> list[tuple[NodeCap, int]]:
    """The first ``most`` entries of ``room`` most room first (what ``sorted`` by
    (-count, whole_free, idx) would list first): every entry holds at least one replica,
    so a gang of ``most`` replicas never needs more."""
    best: list[tuple[NodeCap, int]] = []
    for entry in room:
        nc, count = entry
        at = len(best)
        while at > 0 and _more_room(nc, count, best[at - 1][0], best[at - 1][1]):
            at -= 1
        if at < most:
            best.insert(at, entry)
            if len(best) > most:
                best.pop()
    return best


def _more_room(a: NodeCap, a_count: int, b: NodeCap, b_count: int) -> bool:
    """Does ``a`` come before ``b`` most room first: (-count, whole_free, idx)?"""
    if a_count != b_count:
        return a_count > b_count
    if a.whole_free != b.whole_free:
        return a.whole_free < b.whole_free
    return a.idx < b.idx


def _tighter(a: NodeCap, a_count: int, b: NodeCap, b_count: int) -> bool:
    """Does ``a`` come before ``b`` tightest first: (count, whole_free, idx)?"""
    if a_count != b_count:
        return a_count < b_count
    if a.whole_free != b.whole_free:
        return a.whole_free < b.whole_free
    return a.idx < b.idx


def _leftover(choice: Choice) -> int:
    return sum(nc.whole_free for nc, _ in choice)
