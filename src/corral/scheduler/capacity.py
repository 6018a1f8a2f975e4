"""The working copy of node capacity, indexed by free space.

``schedule`` never mutates the snapshot. It copies each node's free compute
(milli-GPUs per card), free VRAM per card, free CPU slots and free memory into a
``NodeCap``, and reserves/releases on those copies as it decides. Every change
in a cycle goes through ``reserve``/``release``/``hide`` and is written to a
journal, so a what-if (a gang that may not fit, a preemption that may not
help) runs as a transaction: ``mark = cap.checkpoint()`` ... ``cap.rollback(mark)``
restores the exact state (STYLE.md habit 6, after KAI-Scheduler's
``Statement``). The incremental ``Scheduler`` rolls a whole cycle back the
same way, and applies the world's changes between cycles with ``adjust``.

Nodes are indexed by free whole cards (and by the room on their partly used
cards, and by free CPUs), overall, per *equivalence class* (nodes that every
static filter treats alike) and per model they hold, so best-fit search walks
a few buckets instead of every node. A bucket is walked in node order: its
order is a function of the state alone, never of the history of changes, so
a capacity kept across cycles and one built from a snapshot give the same
search results. Nodes without a free card are in no whole-card bucket (no
search looks there). A *hidden* node (reserved for a job ahead in
the queue) is in no bucket at all until the cycle ends. The candidate
iterators walk live buckets: finish iterating before you reserve or release.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from corral.core.compiled import mypyc_attr
from corral.core.model import Allocation, Gpu, Node
from corral.core.resources import MILLI, cpu_milli
from corral.scheduler.bits import Bucket
from corral.scheduler.node_cap import (
    LOADED,
    ON_DISK,
    PARTIAL_STEP,
    Layout,
    NodeCap,
    card_layout,
)

if TYPE_CHECKING:
    from mypy_extensions import i64

_RESERVE: Final = 0
_RELEASE: Final = 1
_HIDE: Final = 2


class Index:
    """Nodes of one group (all, one class, or holders of one model) by free capacity.

    ``whole[n]``: nodes with n wholly free cards (n > 0); ``partial[k]``: nodes
    whose roomiest partly used card has k x ``PARTIAL_STEP`` milli free;
    ``cpu[0]``/``cpu[1]``: nodes with free CPU slots and no / some wholly free
    card (CPU work looks at the first kind first: their CPUs serve no GPU job).
    Every bucket is a ``Bucket`` over ``nodes``, the capacity's nodes by index.
    """

    __slots__ = ("cpu", "partial", "whole")

    def __init__(self, max_gpus: int, nodes: list[NodeCap]) -> None:
        self.whole = [Bucket(nodes) for _ in range(max_gpus + 1)]  # [0] stays empty
        self.partial = [Bucket(nodes) for _ in range(MILLI // PARTIAL_STEP)]
        self.cpu = (Bucket(nodes), Bucket(nodes))

    def add(self, nc: NodeCap) -> None:
        if nc.whole_free > 0:
            self.whole[nc.whole_free].add(nc)
        if nc.partial_level >= 0:
            self.partial[nc.partial_level].add(nc)
        if nc.cpus_free > 0:
            self._cpu(nc.whole_free).add(nc)

    def remove(self, nc: NodeCap) -> None:
        if nc.whole_free > 0:
            self.whole[nc.whole_free].remove(nc)
        if nc.partial_level >= 0:
            self.partial[nc.partial_level].remove(nc)
        if nc.cpus_free > 0:
            self._cpu(nc.whole_free).remove(nc)

    def move(self, nc: NodeCap, whole: i64, partial: i64, cpu: bool) -> None:
        """``nc`` changed from (``whole``, ``partial``, ``cpu``): move it where it changed."""
        now_whole = nc.whole_free
        if whole != now_whole:
            if whole > 0:
                self.whole[whole].remove(nc)
            if now_whole > 0:
                self.whole[now_whole].add(nc)
        now_partial = nc.partial_level
        if partial != now_partial:
            if partial >= 0:
                self.partial[partial].remove(nc)
            if now_partial >= 0:
                self.partial[now_partial].add(nc)
        has_cpu = nc.cpus_free > 0
        if cpu != has_cpu or (whole > 0) != (now_whole > 0):
            if cpu:
                self._cpu(whole).remove(nc)
            if has_cpu:
                self._cpu(now_whole).add(nc)

    def _cpu(self, whole_free: int) -> Bucket:
        """The CPU bucket of a node with ``whole_free`` wholly free cards."""
        return self.cpu[1] if whole_free > 0 else self.cpu[0]


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
class Change:
    """One entry of a ``Capacity``'s journal: what ``op`` (reserve, release, hide) did to
    ``nc``."""

    __slots__ = ("cpus", "gpus", "memory", "milli", "nc", "op", "vram")

    def __init__(
        self,
        op: i64,
        nc: NodeCap,
        gpus: tuple[int, ...],
        milli: i64,
        vram: i64,
        cpus: i64,
        memory: i64,
    ) -> None:
        self.op = op
        self.nc = nc
        self.gpus = gpus
        self.milli = milli
        self.vram = vram
        self.cpus = cpus
        self.memory = memory


class Capacity:
    """Working copy of all nodes' free capacity, with indexes and an undo journal.

    Indexes: ``everywhere`` (every schedulable node), ``by_class`` (one per node
    class) and ``by_model`` (``(model, LOADED | ON_DISK)``: nodes holding a model
    some queued job needs). A node sits in one index of each kind it belongs to.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        classes: Sequence[int],
        models: Iterable[str] = (),
        held: Iterable[Allocation] = (),
    ) -> None:
        layouts: dict[tuple[Gpu, ...], Layout] = {}
        self.nodes: list[NodeCap] = []
        for i, (node, cls) in enumerate(zip(nodes, classes, strict=True)):
            layout = layouts.get(node.gpus)
            if layout is None:
                layout = layouts[node.gpus] = card_layout(node.gpus)
            self.nodes.append(NodeCap(i, node, cls, layout))
        self.by_name: dict[str, NodeCap] = {nc.name: nc for nc in self.nodes}
        self._preload(held)
        self.max_gpus = max((nc.gpu_count for nc in self.nodes), default=0)
        self.everywhere = Index(self.max_gpus, self.nodes)
        self.by_class: dict[int, Index] = {}
        self.by_model: dict[tuple[str, int], Index] = {}
        self._journal: list[Change] = []
        # A new, never reused value whenever capacity is given back: "did not fit at
        # generation g" stays true while the generation is still g (capacity only shrank).
        self.generation = 0
        self._generations = 0
        wanted = frozenset(models)
        alone = len({nc.cls for nc in self.nodes if nc.schedulable}) == 1
        for nc in self.nodes:
            if nc.schedulable:
                nc.groups = self._groups_of(nc, wanted, alone)
                for index in nc.groups:
                    index.add(nc)

    def _preload(self, held: Iterable[Allocation]) -> None:
        """Subtract what existing allocations hold, before indexing (no journal)."""
        touched: set[NodeCap] = set()
        for alloc in held:
            nc = self.by_name.get(alloc.node)
            if nc is None:
                continue
            nc.cpus_free -= cpu_milli(alloc.cpus)
            nc.mem_free -= alloc.memory_bytes
            touched.add(nc)
            if alloc.on_cpu:
                continue
            whole = alloc.gpu_milli == MILLI
            positions = nc.to_positions(alloc.gpu_indices)
            if nc.numa_free:
                nc.draw_numa(positions, -cpu_milli(alloc.cpus))
            for g in positions:
                card = nc.cards[g]
                card.free -= alloc.gpu_milli
                nc.milli_free -= alloc.gpu_milli
                card.vram_free -= nc.gpu_vram[g] if whole else alloc.vram_bytes
        for nc in touched:
            nc._recount()

    def _groups_of(self, nc: NodeCap, models: frozenset[str], alone: bool) -> list[Index]:
        """The indexes of ``nc``; ``alone``: its class is every schedulable node (one index)."""
        own = self.by_class.get(nc.cls)
        if own is None:
            own = self.by_class[nc.cls] = (
                self.everywhere if alone else Index(self.max_gpus, self.nodes)
            )
        groups = [self.everywhere] if own is self.everywhere else [self.everywhere, own]
        node = nc.node
        if not models:
            return groups
        for model in sorted(models & (node.models_loaded | node.models_on_disk)):
            key = (model, LOADED if model in node.models_loaded else ON_DISK)
            holders = self.by_model.get(key)
            if holders is None:
                holders = self.by_model[key] = Index(self.max_gpus, self.nodes)
            groups.append(holders)
        return groups

    def classes(self) -> list[int]:
        """Class ids that have at least one schedulable node."""
        return list(self.by_class)

    # -- changes ----------------------------------------------------------

    def reserve(
        self, nc: NodeCap, gpus: tuple[int, ...], milli: i64, vram: i64, cpus: i64, memory: i64 = 0
    ) -> None:
        """Take ``milli``/``vram`` on each card in ``gpus``, ``cpus`` slots and ``memory``
        bytes of ``nc``.

        ``milli == MILLI`` takes whole cards, VRAM and all (``vram`` is then ignored).
        """
        self._apply(nc, gpus, -milli, -vram, -cpus, -memory)
        self._journal.append(Change(_RESERVE, nc, gpus, milli, vram, cpus, memory))

    def release(
        self, nc: NodeCap, gpus: tuple[int, ...], milli: i64, vram: i64, cpus: i64, memory: i64 = 0
    ) -> None:
        """Give back what ``reserve`` took (a preemption what-if, or undo)."""
        self._apply(nc, gpus, milli, vram, cpus, memory)
        self._journal.append(Change(_RELEASE, nc, gpus, milli, vram, cpus, memory))
        self._generations += 1
        self.generation = self._generations

    def hide(self, nc: NodeCap) -> None:
        """Take ``nc`` out of every index (reserved for a job ahead); undone by ``rollback``.

        Searches no longer see it, so, like ``reserve``, it never revives a failed fit.
        """
        if nc.hidden:
            return
        for index in nc.groups:
            index.remove(nc)
        nc.hidden = True
        self._journal.append(Change(_HIDE, nc, (), 0, 0, 0, 0))

    def adjust(
        self, nc: NodeCap, gpus: tuple[int, ...], milli: i64, vram: i64, cpus: i64, memory: i64 = 0
    ) -> None:
        """Between cycles: an allocation started (negative amounts) or ended (positive).

        Not journaled: the state a cycle starts from. Giving back bumps the generation.
        """
        if self._journal:
            raise RuntimeError("capacity changed between cycles while a cycle is open")
        self._apply(nc, gpus, milli, vram, cpus, memory)
        if milli > 0 or vram > 0 or cpus > 0 or memory > 0:
            self._generations += 1
            self.generation = self._generations

    def commit(self) -> None:
        """End a cycle keeping its reserves and releases (the plan, as it will be applied);
        its hidden nodes come back."""
        for change in self._journal:
            nc = change.nc
            if change.op == _HIDE and nc.hidden:
                nc.hidden = False
                for index in nc.groups:
                    index.add(nc)
        self._journal.clear()

    def checkpoint(self) -> tuple[int, int]:
        """A mark to roll back to."""
        return (len(self._journal), self.generation)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Undo every change after ``mark``, newest first. Exact: tested by property.

        The generation returns to the mark's: the state is the same as then.
        Callers that cached "did not fit" *during* the what-if must drop those
        entries (``Cycle.rollback`` does, through its memo log).
        """
        length, generation = mark
        journal = self._journal
        while len(journal) > length:
            change = journal.pop()
            nc = change.nc
            if change.op == _HIDE:
                nc.hidden = False
                for index in nc.groups:
                    index.add(nc)
                continue
            if change.op == _RESERVE:
                self._apply(nc, change.gpus, change.milli, change.vram, change.cpus, change.memory)
            else:
                self._apply(
                    nc, change.gpus, -change.milli, -change.vram, -change.cpus, -change.memory
                )
        self.generation = generation

    def _apply(
        self, nc: NodeCap, gpus: tuple[int, ...], milli: i64, vram: i64, cpus: i64, memory: i64
    ) -> None:
        whole_before, partial_before, cpu_before = nc.whole_free, nc.partial_level, nc.cpus_free > 0
        if gpus:
            cards, sizes = nc.cards, nc.gpu_vram
            whole: i64 = whole_before
            touched = False  # a card is, or was, partly used: the partial level may move
            for g in gpus:
                if not 0 <= g < len(cards):
                    continue
                card = cards[g]
                was = card.free
                now = card.free = was + milli
                nc.milli_free += milli
                if milli == MILLI or milli == -MILLI:  # a whole card: all its VRAM goes with it
                    card.vram_free += sizes[g] if milli > 0 else -sizes[g]
                else:
                    card.vram_free += vram
                if now == MILLI:
                    whole += 1
                if was == MILLI:
                    whole -= 1
                touched = touched or 0 < was < MILLI or 0 < now < MILLI
            nc.whole_free = whole
            if touched:
                nc._recount()
        nc.cpus_free += cpus
        nc.mem_free += memory
        if nc.numa_free:
            nc.draw_numa(gpus, cpus)
        if nc.hidden:
            return
        for index in nc.groups:
            index.move(nc, whole_before, partial_before, cpu_before)
