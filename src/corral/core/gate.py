"""The one gate of every lifecycle (STYLE.md habit 4): ``transition``.

It checks a change against its lifecycle's table and appends a ``Transition`` to the
entity's history, so every change is explained and recorded. The simulator's world
passes the gate three times per job: it is kept cheap (below).
"""

from __future__ import annotations

from collections.abc import MutableSequence
from typing import Any, Final

from corral.core.errors import IllegalTransition
from corral.core.lifecycle import Lifecycle, S, Transition


class _Edge:
    """An edge the gate found in its table: (lifecycle, from, to), compared by identity."""

    __slots__ = ("current", "lifecycle", "target")

    def __init__(self, lifecycle: Any, current: Any, target: Any) -> None:
        self.lifecycle = lifecycle
        self.current = current
        self.target = target


_FOUND: Final[list[_Edge]] = []
"""Edges found allowed so far, the first ``FOUND_MAX``: a table is frozen, so an edge found
in it stays allowed. The hot ones are matched by identity, without hashing the states
(an ``Enum`` hashes in Python code): a speed path for the simulator's three per job."""
FOUND_MAX: Final = 32


def transition(
    lifecycle: Lifecycle[S],
    entity: str,
    current: S,
    target: S,
    *,
    at: float,
    why: str,
    history: MutableSequence[Transition] | None = None,
) -> S:
    """The gate: check ``current -> target`` against the table, record it, return ``target``.

    Raises ``IllegalTransition`` for an edge the table lacks: that is a bug in
    the caller, never a normal outcome.
    """
    for edge in _FOUND:
        if edge.current is current and edge.target is target and edge.lifecycle is lifecycle:
            break
    else:
        allowed = lifecycle.targets.get(current)
        if allowed is None or target not in allowed:
            raise IllegalTransition(lifecycle.name, current.value, target.value)
        if len(_FOUND) < FOUND_MAX:
            _FOUND.append(_Edge(lifecycle, current, target))
    if history is not None:
        history.append(Transition(lifecycle.name, entity, current.value, target.value, at, why))
    return target
