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

from collections.abc import Iterable, Mapping, Sequence
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
    nodes = tuple(nodes)
    at = {node.name: i for i, node in enumerate(nodes)}
    # each node's free milli-GPUs by card index: no (node, card) tuple made and hashed
    free = [[MILLI] * (max((g.index for g in node.gpus), default=-1) + 1) for node in nodes]
    for alloc in allocations:
        i = at.get(alloc.node)
        if i is not None and alloc.active and not alloc.on_cpu:
            cards = free[i]
            for card in alloc.gpu_indices:
                if 0 <= card < len(cards):
                    cards[card] = cards[card] - alloc.gpu_milli
    return of_free(nodes, free)


def of_free(nodes: Sequence[Node], free: Sequence[list[int]]) -> Fragmentation:
    """Like ``measure``, from what is free rather than what is allocated: ``free[i]`` holds
    node ``nodes[i]``'s free milli-GPUs by card index (a shell that keeps them, as the
    simulator's world does, need not walk its allocations: O(cards), no map)."""
    total = free_cards = whole_nodes_free = stranded = 0
    blocks: dict[int, int] = {}  # free cards on a node -> nodes with that many
    for node, cards in zip(nodes, free, strict=True):
        if not node.schedulable or not node.gpus:
            continue
        node_free = 0
        for gpu in node.gpus:
            index = gpu.index
            taken = MILLI - cards[index] if 0 <= index < len(cards) else 0
            if taken > MILLI:  # over-committed: counted as wholly taken
                taken = MILLI
            if taken == 0:
                node_free += 1
            else:
                stranded += MILLI - taken
        total += len(node.gpus)
        free_cards += node_free
        blocks[node_free] = blocks.get(node_free, 0) + 1
        if node_free == len(node.gpus):
            whole_nodes_free += node_free
    blocks.pop(0, None)
    return Fragmentation(total, free_cards, whole_nodes_free, stranded, blocks)
