"""One node's capacity on a working copy: its cards' free compute and VRAM, its free CPUs
and host memory.

A ``NodeCap`` is what ``Capacity`` (``capacity.py``) indexes and reserves on; ``Card``
is one card's free milli-GPUs and VRAM. Cards are addressed by position here;
``Gpu.index`` (what agents and plans use) may differ when a node hides a card.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from corral.core.model import Gpu, Node
from corral.core.resources import MILLI, cpu_milli

if TYPE_CHECKING:  # capacity.py imports this module
    from mypy_extensions import i64

    from corral.scheduler.capacity import Index

LOADED: Final = 2
ON_DISK: Final = 1
ABSENT: Final = 0
"""Model locality of a node for a job's model (``ABSENT`` also when there is no model)."""

PARTIAL_STEP: Final = 50
"""Width, in milli-GPUs, of a bucket of the shared-card index (20 buckets per card)."""

Layout = tuple[list[int], list[str], dict[int, int] | None]
"""VRAM and model per card position, and ``Gpu.index`` -> position (None: the same)."""


def card_layout(gpus: tuple[Gpu, ...]) -> Layout:
    """Static facts of a node's cards; shared by nodes with identical cards (read-only).

    Cards are addressed by position here; ``Gpu.index`` (what agents and plans
    use) may differ when a node hides a card.
    """
    indices = [g.index for g in gpus]
    positions = (
        None if indices == list(range(len(indices))) else {i: p for p, i in enumerate(indices)}
    )
    return [g.vram_bytes for g in gpus], [g.model for g in gpus], positions


class Card:
    """One card's free milli-GPUs (``free``) and VRAM bytes (``vram_free``): on a working
    copy, and in the simulator's world."""

    __slots__ = ("free", "vram_free")

    def __init__(self, free: int, vram_free: int) -> None:
        self.free: i64 = free
        self.vram_free: i64 = vram_free


class NodeCap:
    """Free capacity of one node. Mutable; owned by ``Capacity``."""

    __slots__ = (
        "card_numa",
        "cards",
        "cls",
        "cpus_free",
        "gpu_model",
        "gpu_vram",
        "groups",
        "hidden",
        "idx",
        "mem_free",
        "milli_free",
        "node",
        "numa_free",
        "partial_level",
        "positions",
        "schedulable",
        "whole_free",
    )

    def __init__(self, idx: int, node: Node, cls: int, layout: Layout | None = None) -> None:
        self.idx: i64 = idx
        self.node = node
        self.cls = cls
        self.schedulable = node.schedulable
        self.gpu_vram, self.gpu_model, self.positions = layout or card_layout(node.gpus)
        self.cards = [Card(MILLI, vram) for vram in self.gpu_vram]  # by position
        self.milli_free: i64 = MILLI * len(self.gpu_vram)  # the cards' free, summed (scorers)
        self.cpus_free: i64 = cpu_milli(node.cpus)  # milli-CPUs
        self.mem_free: i64 = node.memory_bytes  # bytes of host memory
        # Free milli-CPUs of each reported NUMA node (by position), and each card's NUMA
        # node's position (-1: unknown); both empty when the node reported none (one pool).
        self.numa_free: list[i64] = []
        self.card_numa: list[int] = []
        if node.numa_cpus:
            self._numa(node)
        self.whole_free: i64 = len(self.gpu_vram)
        self.partial_level: i64 = -1  # bucket of the roomiest partly used card; -1: none
        self.groups: list[Index] = []  # the indexes it sits in (none when not schedulable)
        self.hidden = False  # reserved for a job ahead: out of every index this cycle

    def _numa(self, node: Node) -> None:
        at = {numa: p for p, (numa, _) in enumerate(node.numa_cpus)}
        self.numa_free = [cpu_milli(cpus) for _, cpus in node.numa_cpus]
        self.card_numa = [at.get(g.numa, -1) for g in node.gpus]

    def numa_room(self, gpus: tuple[int, ...]) -> i64:
        """Free milli-CPUs for a job on cards ``gpus`` (positions): its cards' NUMA nodes'
        together, less what other nodes lent them (a node below zero gave CPUs to a job
        spanning it and a neighbour); the node's free CPUs when NUMA is not reported, or a
        card's node is unknown."""
        free = self.numa_free
        if not free:
            return self.cpus_free
        mine = 0  # bit per NUMA position (a node has few)
        for g in gpus:
            k = self.card_numa[g] if 0 <= g < len(self.card_numa) else -1
            if k < 0:
                return self.cpus_free
            mine |= 1 << k
        room: i64 = 0
        for k, f in enumerate(free):
            if mine >> k & 1 or f < 0:  # its nodes' free CPUs, less what others lent
                room += f
        return min(room, self.cpus_free)

    def draw_numa(self, gpus: tuple[int, ...], cpus: i64) -> None:
        """Take ``cpus`` (negative: give back) from the NUMA nodes of cards ``gpus``, split
        evenly by card: a function of the job alone, so giving back returns exactly what
        was taken, whatever happened in between. A card of unknown node takes from none
        (its share counts against the node's pool only)."""
        count = len(gpus)
        if count == 0 or cpus == 0:
            return
        magnitude = -cpus if cpus < 0 else cpus
        share, left = magnitude // count, magnitude % count
        sign: i64 = -1 if cpus < 0 else 1
        for i, g in enumerate(gpus):
            k = self.card_numa[g] if 0 <= g < len(self.card_numa) else -1
            if k >= 0:
                self.numa_free[k] += sign * (share + (left if i == 0 else 0))

    def to_positions(self, indices: tuple[int, ...]) -> tuple[int, ...]:
        """Card positions of ``Gpu.index`` values (unknown indices are dropped)."""
        if self.positions is None:
            return indices
        return tuple(self.positions[i] for i in indices if i in self.positions)

    def to_indices(self, positions: tuple[int, ...]) -> tuple[int, ...]:
        """``Gpu.index`` values of card positions."""
        if self.positions is None:
            return positions
        gpus = self.node.gpus
        return tuple(gpus[p].index for p in positions)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_vram)

    def usable(self, gpu: int, vram: i64, models: frozenset[str]) -> bool:
        """Card ``gpu`` is big enough and of an accepted model (any, when ``models`` is empty)."""
        return self.gpu_vram[gpu] >= vram and (not models or self.gpu_model[gpu] in models)

    def whole_free_cards(self, vram: i64, models: frozenset[str]) -> list[int]:
        """Indices of wholly free cards with at least ``vram`` bytes, of an accepted model."""
        if not vram and not models:
            return [i for i, card in enumerate(self.cards) if card.free == MILLI]
        return [
            i
            for i, card in enumerate(self.cards)
            if card.free == MILLI and self.usable(i, vram, models)
        ]

    def milli_for(self, gpu: int, vram: i64, milli: i64) -> i64:
        """Milli-GPUs a shared reservation (``vram`` bytes, ``milli`` compute) takes on ``gpu``."""
        total: i64 = self.gpu_vram[gpu]
        share: i64 = -(-vram * MILLI // total) if total != 0 and vram != 0 else 0
        return max(milli, min(share, MILLI), 1)

    def best_shared_gpu(self, vram: i64, milli: i64, models: frozenset[str]) -> int | None:
        """The card where a shared reservation fits tightest (partly used cards first)."""
        best: int | None = None
        best_left: i64 = 2 * MILLI + 1
        for i, card in enumerate(self.cards):
            if card.vram_free < vram or (models and self.gpu_model[i] not in models):
                continue
            free = card.free
            left: i64 = free - self.milli_for(i, vram, milli)
            if left < 0:
                continue
            if free == MILLI:
                left += MILLI  # a fresh card only when no used card has room
            if left < best_left:
                best, best_left = i, left
        return best

    def _recount(self) -> None:
        whole: i64 = 0
        level: i64 = -1
        for card in self.cards:
            free = card.free
            if free == MILLI:
                whole += 1
            elif free > 0:
                level = max(level, min(free, MILLI - 1) // PARTIAL_STEP)
        self.whole_free = whole
        self.partial_level = level
