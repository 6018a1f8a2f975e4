"""The last plan's placements not yet started, as the kept ``Scheduler`` checks them off.

A caller usually starts a plan's placements in the plan's order, at once (the simulator
always does; the server as its agents confirm them), so each start is checked against
the next placement in that order: no map by allocation id made per plan, nor a look-up
and a delete per start. The first start out of that order (or of an allocation the plan
did not make) puts the placements left in a map by id, which every later start reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from corral.scheduler.api import Placement

if TYPE_CHECKING:
    from mypy_extensions import i64


class Planned:
    """Placements not yet started (see the module docstring)."""

    __slots__ = ("_by_id", "_next", "_order")

    def __init__(self, placements: Sequence[Placement] = ()) -> None:
        # the plan's placements, in order (a plan's tuple is not copied)
        self._order = tuple(placements)
        self._next: i64 = 0  # the placement the next start is expected to be
        self._by_id: dict[str, Placement] | None = None  # made at the first start out of order

    def take(self, alloc_id: str) -> Placement | None:
        """The placement that made allocation ``alloc_id``, checked off (None: not one
        of those left)."""
        by_id = self._by_id
        if by_id is None:
            order, at = self._order, self._next
            if at < len(order) and order[at].allocation_id == alloc_id:
                self._next = at + 1
                return order[at]
            by_id = self._by_id = {p.allocation_id: p for p in self.left()}
        found = by_id.get(alloc_id)  # get and del: see ``Slots.take``
        if found is not None:
            del by_id[alloc_id]
        return found

    def left(self) -> list[Placement]:
        """The placements not started yet, in the plan's order."""
        if self._by_id is not None:
            return list(self._by_id.values())
        return list(self._order[self._next :])
