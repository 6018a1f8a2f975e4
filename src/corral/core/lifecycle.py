"""The values of a lifecycle (STYLE.md habit 4): its table and its recorded changes.

``Lifecycle`` is a named transition table (an edge per allowed change, with why it
exists); ``Transition`` one recorded change. The gate that checks and records a change
is ``gate.transition``; the tables themselves are in ``states.py``. Apart from the gate
so that the gate can be compiled (``Lifecycle``, a generic dataclass, cannot).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

S = TypeVar("S", bound=StrEnum)


@dataclass(frozen=True, slots=True)
class Lifecycle(Generic[S]):
    """A named transition table. ``edges`` maps (from, to) to why that edge exists."""

    name: str
    edges: Mapping[tuple[S, S], str]
    terminal: frozenset[S]
    # ``edges`` as each state's allowed targets, for the gate: a dict of sets looked up by
    # state, not a (from, to) tuple made, hashed and compared per change
    targets: dict[S, frozenset[S]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        targets: dict[S, set[S]] = {}
        for current, target in self.edges:
            targets.setdefault(current, set()).add(target)
        frozen = {current: frozenset(them) for current, them in targets.items()}
        object.__setattr__(self, "targets", frozen)

    def allows(self, current: S, target: S) -> bool:
        allowed = self.targets.get(current)
        return allowed is not None and target in allowed


@dataclass(frozen=True, slots=True)
class Transition:
    """One recorded change of state."""

    lifecycle: str
    entity: str
    current: str
    target: str
    at: float
    why: str
