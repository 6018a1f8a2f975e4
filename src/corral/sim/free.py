"""What is free on each simulated node: a placement takes its share or is refused.

The world checks each placement as the server's verifier would: a card whose
free share or VRAM is short of what the placement asks, a card index the node
does not have, or too few free CPUs or too little memory is a scheduler bug (``PlanRejected``),
never an over-committed node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.core.model import Allocation, Node
from corral.core.resources import MILLI, cpu_milli
from corral.scheduler.api import Placement
from corral.scheduler.node_cap import Card
from corral.sim.errors import PlanRejected

if TYPE_CHECKING:
    from mypy_extensions import i64


class NodeFree:
    """A node's free capacity in the world: its cards (``node_cap.Card``, the record the
    scheduler's working copy keeps per card), CPUs and memory."""

    __slots__ = ("cards", "cpus", "memory")

    def __init__(self, node: Node) -> None:
        self.cards = [Card(MILLI, gpu.vram_bytes) for gpu in node.gpus]
        self.cpus: i64 = cpu_milli(node.cpus)  # milli-CPUs
        self.memory: i64 = node.memory_bytes

    def take(self, p: Placement) -> None:
        """Reserve the placement's GPUs, CPUs and memory, refusing over-commit."""
        cards, milli, vram = self.cards, p.gpu_milli, p.vram_bytes
        if p.gpu_indices and milli <= 0:
            raise PlanRejected(f"placement {p.allocation_id}: GPUs listed with gpu_milli 0")
        for g in p.gpu_indices:
            if not 0 <= g < len(cards):
                raise PlanRejected(f"placement {p.allocation_id}: {p.node} has no GPU {g}")
            card = cards[g]
            if card.free < milli or card.vram_free < vram:
                raise PlanRejected(
                    f"placement {p.allocation_id}: GPU {g} of {p.node} is over-committed"
                )
            card.free -= milli
            card.vram_free -= vram
        self.cpus -= cpu_milli(p.cpus)
        self.memory -= p.memory_bytes
        if self.cpus < 0 or self.memory < 0:
            raise PlanRejected(f"placement {p.allocation_id}: {p.node} lacks free CPUs or memory")

    def give_back(self, alloc: Allocation) -> None:
        """An allocation on this node ended: its GPUs, CPUs and memory are free again."""
        cards, gpu_milli, vram = self.cards, alloc.gpu_milli, alloc.vram_bytes
        for g in alloc.gpu_indices:
            card = cards[g]
            card.free += gpu_milli
            card.vram_free += vram
        self.cpus += cpu_milli(alloc.cpus)
        self.memory += alloc.memory_bytes
