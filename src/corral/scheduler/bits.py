"""Sets of a capacity's nodes as bits, walked in node order: the buckets of its indexes.

A node is in a bucket of an ``Index`` (``capacity.py``) by its free capacity; it moves
between buckets as work starts and ends, two moves per job started. A bucket keeps one
bit per node index, so a move is a bit operation whatever the bucket holds, where a
list in node order needed a search and a shift each time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # capacity.py imports this module
    from mypy_extensions import i64

    from corral.scheduler.node_cap import NodeCap

WORD: Final = 60
"""Node indices per word of a bucket's bits (a word stays a small machine integer)."""


class Bucket:
    """The nodes of one bucket of an ``Index``, walked in node order (``for nc in bucket``).

    Bit ``i`` of ``words[w].bits`` is node index ``w * WORD + i``. ``size`` lets a search
    skip an empty bucket. A walk reads the words as it goes: finish walking before you
    reserve or release. The hot searches walk with ``next_at`` rather than ``for``: a
    generator resumed per node cost about 3% of the compiled simulator.
    """

    __slots__ = ("nodes", "size", "words")

    def __init__(self, nodes: list[NodeCap]) -> None:
        self.nodes = nodes  # every node of the capacity, by index (shared by its buckets)
        self.words = [BitWord() for _ in range(len(nodes) // WORD + 1)]
        self.size: i64 = 0

    def __iter__(self) -> Iterator[NodeCap]:
        nodes, i = self.nodes, self.next_at(0)
        while i >= 0:
            yield nodes[i]
            i = self.next_at(i + 1)

    def next_at(self, pos: i64) -> i64:
        """The index of the first node in the bucket at or after index ``pos`` (-1: none)."""
        words = self.words
        w: i64 = pos // WORD
        if w >= len(words):
            return -1
        shift: i64 = pos % WORD
        bits: i64 = words[w].bits >> shift << shift  # the bits below ``pos`` cleared
        while bits == 0:
            w += 1
            if w >= len(words):
                return -1
            bits = words[w].bits
        return w * WORD + int(bits & -bits).bit_length() - 1

    def __contains__(self, nc: NodeCap) -> bool:
        return (self.words[nc.idx // WORD].bits >> (nc.idx % WORD)) & 1 == 1

    def add(self, nc: NodeCap) -> None:
        word = self.words[nc.idx // WORD]
        bit: i64 = 1
        bit <<= nc.idx % WORD  # a variable shifted: mypyc shifts a literal 1 in 32 bits
        if word.bits & bit == 0:
            word.bits |= bit
            self.size += 1

    def remove(self, nc: NodeCap) -> None:
        word = self.words[nc.idx // WORD]
        bit: i64 = 1
        bit <<= nc.idx % WORD
        if word.bits & bit != 0:
            word.bits ^= bit
            self.size -= 1


class BitWord:
    """``WORD`` bits of a ``Bucket``, changed in place: an int stored back in a list is a new
    object per change, which cost about 4% of the compiled simulator (two moves per job)."""

    __slots__ = ("bits",)

    def __init__(self) -> None:
        self.bits: i64 = 0
