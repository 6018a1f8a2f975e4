"""How close two GPUs of one node are, and the closest set of them.

Data-parallel training exchanges gradients between its GPUs every step: over
NVLink that is many times faster than through a PCIe switch, itself faster
than through a CPU's host bridge or across sockets. The agent reports each
GPU's NUMA node and its link to every other GPU (``Gpu.numa``, ``Gpu.links``);
a job asking for several GPUs of one node gets the closest free set.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from corral.core.model import Gpu

LINKS = ("nvlink", "pcie_switch", "same_socket", "cross_socket")
"""Link kinds, closest first; an unknown link counts as the farthest."""

MAX_SETS = 5000
"""GPU sets compared at most (C(16, 4) = 1820): beyond that the first free GPUs are taken."""

Link = Callable[[int, int], str]


def distance(kind: str) -> int:
    return LINKS.index(kind) if kind in LINKS else len(LINKS) - 1


def closest(
    free: Sequence[int], count: int, link: Link, numa: Callable[[int], int]
) -> tuple[int, ...]:
    """``count`` of the ``free`` GPUs linked as closely as possible: the set whose pairs'
    links are closest in sum (NVLink-connected sets first), then on the fewest NUMA nodes,
    then the lowest indices."""
    ordered = sorted(free)
    if count <= 1 or count >= len(ordered) or _too_many(len(ordered), count):
        return tuple(ordered[:count])

    def key(gpus: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
        pairs = sum(distance(link(a, b)) for a, b in itertools.combinations(gpus, 2))
        return pairs, len({numa(g) for g in gpus}), gpus

    return min(itertools.combinations(ordered, count), key=key)


def describe(gpus: Sequence[int], link: Link, numa: Callable[[int], int]) -> str:
    """``"GPUs 0,1 (nvlink) on NUMA node 0"``: the farthest link among them, their nodes."""
    kinds = {link(a, b) for a, b in itertools.combinations(gpus, 2)}
    worst = max(kinds, key=distance) if kinds else "alone"
    nodes = sorted({numa(g) for g in gpus} - {-1})
    where = ",".join(map(str, nodes)) or "?"
    return f"GPUs {','.join(map(str, gpus))} ({worst}) on NUMA node {where}"


def of_gpus(gpus: Sequence[Gpu]) -> tuple[Link, Callable[[int], int]] | None:
    """The link and NUMA lookups of a node's reported ``gpus`` (positions are GPU
    indices); None when its agent reported no topology."""
    if not gpus or not gpus[0].links:
        return None

    def link(a: int, b: int) -> str:
        row = gpus[a].links if a < len(gpus) else ()
        return row[b] if b < len(row) else ""

    def numa(g: int) -> int:
        return gpus[g].numa if g < len(gpus) else -1

    return link, numa


def _too_many(n: int, k: int) -> bool:
    total = 1
    for i in range(k):
        total = total * (n - i) // (i + 1)
    return total > MAX_SETS
