"""How fragmented the free GPU capacity is: a measure the simulator reports.

Free GPUs are worth most in whole free nodes (a big job or a gang can use
them) and least as slivers of partly used cards. ``fragmentation`` counts,
over schedulable nodes, free whole cards, how many of them sit on wholly free
nodes, and the compute stranded on partly used cards, and summarises it as
``score`` = 1 - (free cards on whole free nodes / all free card capacity):
0 when every free GPU is in a whole free node, towards 1 when free capacity
is scattered. ``usable_for(n)`` answers "how many n-GPU jobs would still fit".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from corral.core.model import Allocation, Node
from corral.core.resources import MILLI
from corral.scheduler.api import Snapshot


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """Free GPU capacity of the schedulable nodes, and how it is spread."""

    total_gpus: int  # cards on schedulable nodes
    free_gpus: int  # wholly free cards
    free_in_whole_nodes: int  # wholly free cards on nodes with nothing allocated
    stranded_milli: int  # free compute on partly used cards
    blocks: Mapping[int, int] = field(default_factory=dict)  # free whole cards -> nodes

    @property
    def score(self) -> float:
        """0: all free capacity in whole free nodes; towards 1: scattered."""
        free = self.free_gpus * MILLI + self.stranded_milli
        return 0.0 if free == 0 else 1.0 - self.free_in_whole_nodes * MILLI / free

    @property
    def largest_block(self) -> int:
        """Most wholly free cards on one node."""
        return max(self.blocks, default=0)

    def usable_for(self, gpus: int) -> int:
        """How many jobs of ``gpus`` whole cards (on one node each) would fit now."""
        if gpus <= 0:
            return 0
        return sum((free // gpus) * nodes for free, nodes in self.blocks.items())


def fragmentation(snapshot: Snapshot) -> Fragmentation:
    """Measure the snapshot's nodes under its active allocations."""
    return measure(snapshot.nodes, snapshot.allocations)


def measure(nodes: Iterable[Node], allocations: Iterable[Allocation]) -> Fragmentation:
    """Like ``fragmentation``, from nodes and allocations directly."""
    # node -> card index -> milli taken: no (node, card) tuple made and hashed per card
    used: dict[str, dict[int, int]] = {}
    for alloc in allocations:
        if alloc.active and not alloc.on_cpu:
            cards = used.get(alloc.node)
            if cards is None:
                cards = used[alloc.node] = {}
            for card in alloc.gpu_indices:
                cards[card] = cards.get(card, 0) + alloc.gpu_milli
    nothing: dict[int, int] = {}
    total = free = whole_nodes_free = stranded = 0
    blocks: dict[int, int] = {}  # not a Counter: a compiled build updates a dict natively
    for node in nodes:
        if not node.schedulable or not node.gpus:
            continue
        node_free = 0
        cards = used.get(node.name, nothing)
        for gpu in node.gpus:
            taken = cards.get(gpu.index, 0)
            if taken > MILLI:
                taken = MILLI
            if taken == 0:
                node_free += 1
            else:
                stranded += MILLI - taken
        total += len(node.gpus)
        free += node_free
        blocks[node_free] = blocks.get(node_free, 0) + 1
        if node_free == len(node.gpus):
            whole_nodes_free += node_free
    blocks.pop(0, None)
    return Fragmentation(total, free, whole_nodes_free, stranded, blocks)
