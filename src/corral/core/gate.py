"""The one gate of every lifecycle (STYLE.md habit 4): ``transition``.

It checks a change against its lifecycle's table and appends a ``Transition`` to the
entity's history, so every change is explained and recorded. A module of its own so
that the compiled build compiles it (``lifecycle.py``, whose generic dataclass mypyc
cannot compile, stays interpreted): the simulator's world passes the gate three times
per job, and an interpreted call from compiled code cost about 1,600 instructions.
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
"""Edges found allowed so far, the first ``FOUND_MAX``: a table is frozen at construction
(``Lifecycle.targets``), so an edge found in it stays allowed, and the hot ones (a job's
queued -> placed -> running -> succeeded) are matched by identity in a short scan, where
the table's two look-ups (a dict of states, a set of targets) were each a hashed probe."""
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
        # ``lifecycle.allows``, inlined: ``Lifecycle`` stays interpreted in the compiled
        # build, and a method call on it from this compiled gate would be a generic call
        allowed = lifecycle.targets.get(current)
        if allowed is None or target not in allowed:
            raise IllegalTransition(lifecycle.name, current.value, target.value)
        if len(_FOUND) < FOUND_MAX:
            _FOUND.append(_Edge(lifecycle, current, target))
    if history is not None:
        history.append(Transition(lifecycle.name, entity, current.value, target.value, at, why))
    return target
