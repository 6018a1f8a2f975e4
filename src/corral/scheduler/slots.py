"""The kept scheduler's allocations in slots, and names numbered as they come.

A kept ``Scheduler`` (``incremental.py``) updates its books on every start and end of
an allocation: what it holds, its expected end, its team's usage, its node's work. An
allocation's id is looked up once, for its slot, a small record of what the scheduler
keeps about it (the allocation, its expected end, its team's number and its node's
index); its node's list of work and the victims' index (``victims.py``) hold the slot
itself, so an end finds everything from the slot. A slot is made per start and dropped
at its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypeVar

from corral.core.compiled import mypyc_attr
from corral.core.model import Allocation
from corral.scheduler.borrowing import Flags

if TYPE_CHECKING:
    from mypy_extensions import i64

K = TypeVar("K")
V = TypeVar("V")

NOWHERE: Final = -1
"""The node index of an allocation on a node the scheduler does not hold."""


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
class Slot:
    """What the scheduler keeps about one allocation it holds."""

    __slots__ = ("alloc", "at", "end", "first", "kin", "node", "running", "team", "victim_at")

    def __init__(self, alloc: Allocation, end: float | None, team: i64, node: i64) -> None:
        self.alloc = alloc
        self.end = end  # expected end (None: not known)
        self.team = team  # its team's number (``TeamNumbers``)
        self.node = node  # its node's index (``NOWHERE``: not a node held)
        self.at: i64 = 0  # its place in its node's list of work (``join``)
        self.victim_at: i64 = -1  # its place in its node's list of victims there (-1: none)
        self.kin: Slot | None = None  # the next indexed slot whose job set has its first job
        # its key in ``VictimIndex.by_jobs`` (its first job's id), noted as it is indexed
        self.first = ""
        # its user's count of active allocations in its class, while it is counted there
        self.running: RunningCount | None = None

    def count_in(self, running: dict[str, dict[str, RunningCount]]) -> None:
        """Its allocation starts counting as its user's running work in its class
        (``running``: class -> user -> count); it holds the count until ``uncount``."""
        alloc = self.alloc
        users = inner_map(running, alloc.priority)
        kept = users.get(alloc.user)
        if kept is None:
            kept = users[alloc.user] = RunningCount()
        kept.count += 1.0
        self.running = kept

    def uncount(self) -> None:
        """Its allocation no longer counts (``count_in`` when it started, as every active
        one is): no look-up by class or user."""
        kept = self.running
        if kept is not None:
            kept.count -= 1.0
            self.running = None


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
class RunningCount:
    """A user's active allocations in one priority class. A slot holds the count it is in,
    so an end updates it without looking up class and user. A float: the fair queue adds
    it to the user's recent service when users tie (``served.py``)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0.0


class TeamUsage:
    """Milli-GPUs a team's active allocations hold, and which are flagged borrowed."""

    __slots__ = ("flags", "milli")

    def __init__(self) -> None:
        self.milli: i64 = 0
        self.flags = Flags()


def inner_map(outer: dict[K, dict[str, V]], key: K) -> dict[str, V]:
    """``outer[key]``, made empty when missing (``setdefault`` would make a dict per call)."""
    inner = outer.get(key)
    if inner is None:
        inner = outer[key] = {}
    return inner


class Slots:
    """Each allocation id's slot, in the order the allocations were given."""

    def __init__(self) -> None:
        self.of: dict[str, Slot] = {}  # allocation id -> its slot, in the order given

    def put(self, alloc: Allocation, end: float | None, team: i64, node: i64) -> Slot | None:
        """Give ``alloc`` a slot; None (and nothing changed) if its id is held already."""
        slot = Slot(alloc, end, team, node)
        return slot if self.of.setdefault(alloc.id, slot) is slot else None

    def take(self, alloc_id: str) -> Slot:
        """``alloc_id``'s slot, no longer held (KeyError if it was not)."""
        return self.of.pop(alloc_id)

    def order(self, ids: list[str]) -> None:
        """Hold the ids (exactly those held) in this order."""
        of = self.of
        self.of = {alloc_id: of[alloc_id] for alloc_id in ids}


def join(work: list[Slot], slot: Slot) -> None:
    """Put ``slot`` at the end of a node's ``work``, noting where."""
    slot.at = len(work)
    work.append(slot)


def leave(work: list[Slot], slot: Slot) -> None:
    """Take ``slot`` out of a node's ``work``: the last one takes its place (no walk, and
    no other slot touched; no reader depends on the order of a node's work)."""
    last = work.pop()
    if last is not slot:
        work[slot.at] = last
        last.at = slot.at


class TeamNumbers:
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
