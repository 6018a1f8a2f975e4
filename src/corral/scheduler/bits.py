"""Sets of a capacity's nodes as bits, walked in node order: the buckets of its indexes.

A node is in a bucket of an ``Index`` (``capacity.py``) by its free capacity; it moves
between buckets as work starts and ends, two moves per job started. A bucket keeps one
bit per node index, so a move is a bit operation whatever the bucket holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # capacity.py imports this module: its nodes are named for the types
    from mypy_extensions import i64

    from corral.scheduler.capacity import NodeCap

WORD: Final = 60
"""Node indices per word of a bucket's bits: a word stays below 2**62, so a compiled
build keeps it unboxed and setting or clearing a bit allocates nothing."""


class Bucket:
    """The nodes of one bucket of an ``Index``, walked in node order (``for nc in bucket``).

    Kept as one bit per node index, in words of ``WORD`` bits: a node joins or leaves
    with one bit operation whatever the bucket holds (a list in node order needed a
    bisect and a shift of the list each time, twice per move between buckets; moves are
    two per job started). Each word is a record (``Word``), not an int in the list: a
    compiled build changes its bits natively, where storing a changed word in a list
    boxed it (a new int object per join and leave). ``size`` tells a search to skip an
    empty bucket. A walk reads the words as it goes: finish walking before you reserve
    or release.
    """

    __slots__ = ("nodes", "size", "words")

    def __init__(self, nodes: list[NodeCap]) -> None:
        self.nodes = nodes  # every node of the capacity, by index (shared by its buckets)
        self.words = [Word() for _ in range(len(nodes) // WORD + 1)]
        self.size: i64 = 0

    def __iter__(self) -> Iterator[NodeCap]:
        nodes, i = self.nodes, self.next_at(0)  # the one walk of the bits: ``next_at``'s
        while i >= 0:
            yield nodes[i]
            i = self.next_at(i + 1)

    def next_at(self, pos: i64) -> i64:
        """The index of the first node in the bucket at or after index ``pos`` (-1: none).

        The searches walk a bucket with it (``i = b.next_at(0)`` ... ``i = b.next_at(i +
        1)``): a compiled build calls it natively, where ``for nc in bucket`` resumed a
        generator through a generic ``next`` per node.
        """
        words = self.words
        w: i64 = pos // WORD
        end: i64 = len(words)
        if w >= end:
            return -1
        shift: i64 = pos % WORD
        bits: i64 = words[w].bits >> shift << shift  # the bits below ``pos`` cleared
        while bits == 0:
            w += 1
            if w >= end:
                return -1
            bits = words[w].bits
        return w * WORD + int(bits & -bits).bit_length() - 1

    def __contains__(self, nc: NodeCap) -> bool:
        return (self.words[nc.idx // WORD].bits >> (nc.idx % WORD)) & 1 == 1

    def add(self, nc: NodeCap) -> None:
        idx: i64 = nc.idx
        word = self.words[idx // WORD]
        bit: i64 = 1  # shifted as a variable: mypyc shifts a literal 1 as a C int (32 bits)
        bit <<= idx % WORD
        if word.bits & bit == 0:
            word.bits |= bit
            self.size += 1

    def remove(self, nc: NodeCap) -> None:
        idx: i64 = nc.idx
        word = self.words[idx // WORD]
        bit: i64 = 1  # shifted as a variable: mypyc shifts a literal 1 as a C int (32 bits)
        bit <<= idx % WORD
        if word.bits & bit != 0:
            word.bits ^= bit
            self.size -= 1


class Word:
    """``WORD`` bits of a ``Bucket``: bit ``i`` of word ``w`` is node index ``w * WORD + i``."""

    __slots__ = ("bits",)

    def __init__(self) -> None:
        self.bits: i64 = 0
