"""The kept scheduler's allocations in numbered slots, and names numbered as they come.

A kept ``Scheduler`` (``incremental.py``) updates its books on every start and end of
an allocation: what it holds, its expected end, its team's usage, its node's work.
Kept in maps by allocation id, team and node names, each of those was a lookup by a
string, and at a million simulated jobs such lookups were about a quarter of the time,
mostly cache misses on maps of allocations started long before (docs/performance.md,
"The sim-speed-6 round"). Here an allocation's id is looked up once, for its slot, and
the rest is read from lists by that slot: the allocation, its expected end, its team's
number and its node's index. A slot freed by an end is reused by the next start (the
one freed last first: its lists' entries are likely still in the cache).
"""

from __future__ import annotations

from corral.core.model import Allocation

NOWHERE = -1
"""The node index of an allocation on a node the scheduler does not hold."""


class Slots:
    """Allocations by slot, and each allocation id's slot (in the order they were given)."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}  # allocation id -> slot, in the order given
        self.alloc: list[Allocation] = []  # slot -> allocation (a freed slot keeps its last)
        self.end: list[float | None] = []  # slot -> expected end (None: not known)
        self.team: list[int] = []  # slot -> its team's number (``Numbers``)
        self.node: list[int] = []  # slot -> its node's index (``NOWHERE``: not held)
        self._free: list[int] = []  # slots to reuse, the last freed last

    def __len__(self) -> int:
        return len(self.of)

    def put(self, alloc: Allocation, end: float | None, team: int, node: int) -> int:
        """Give ``alloc`` (whose id is not held) a slot; its number."""
        free = self._free
        if free:
            slot = free.pop()
            self.alloc[slot] = alloc
            self.end[slot] = end
            self.team[slot] = team
            self.node[slot] = node
        else:
            slot = len(self.alloc)
            self.alloc.append(alloc)
            self.end.append(end)
            self.team.append(team)
            self.node.append(node)
        self.of[alloc.id] = slot
        return slot

    def take(self, alloc_id: str) -> int:
        """Free ``alloc_id``'s slot (KeyError if not held) and say which it was; its
        entries stay readable until the slot is reused."""
        slot = self.of[alloc_id]  # get and del, not pop: a compiled build has both natively
        del self.of[alloc_id]
        self._free.append(slot)
        return slot

    def order(self, ids: list[str]) -> None:
        """Hold the ids (exactly those held) in this order."""
        of = self.of
        self.of = {alloc_id: of[alloc_id] for alloc_id in ids}

    def held(self) -> list[int]:
        """The slots in use, in the order their allocations were given."""
        return list(self.of.values())


class Numbers:
    """Names (of teams) numbered 0, 1, ... as they first come; a number is never reused."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}
        self.names: list[str] = []

    def number(self, name: str) -> int:
        """``name``'s number, given now if it has none."""
        n = self.of.get(name)
        if n is None:
            n = self.of[name] = len(self.names)
            self.names.append(name)
        return n
