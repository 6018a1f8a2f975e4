"""The values of a lifecycle (STYLE.md habit 4): its table and its recorded changes.

``Lifecycle`` is a named transition table (an edge per allowed change, with why it
exists); ``Transition`` one recorded change. The gate that checks and records a change
is ``gate.transition``; the tables themselves are in ``states.py``. A module of its
own: the compiled build leaves it interpreted (mypyc cannot compile the generic
dataclass ``Lifecycle``) and compiles the gate, which imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

S = TypeVar("S", bound=StrEnum)


@dataclass(frozen=True, slots=True)
class Lifecycle(Generic[S]):
    """A named transition table. ``edges`` maps (from, to) to why that edge exists."""

    name: str
    edges: Mapping[tuple[S, S], str]
    terminal: frozenset[S]

    def allows(self, current: S, target: S) -> bool:
        return (current, target) in self.edges


@dataclass(frozen=True, slots=True)
class Transition:
    """One recorded change of state."""

    lifecycle: str
    entity: str
    current: str
    target: str
    at: float
    why: str
