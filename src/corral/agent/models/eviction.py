"""Which files to delete to make room: a pure decision over what the cache holds.

The cache shell lists what it holds as ``Candidate`` values and asks
``plan_eviction`` what to delete so that ``need`` more bytes fit the budget.
The order, cheapest loss first:

1. partial downloads nobody is fetching now (``Rank.PARTIAL``): they only save
   a re-download of some bytes;
2. complete files no model name points to any more (``Rank.ORPHAN``), e.g. the
   old version of a model whose registry entry changed;
3. models, least recently used first (``Rank.MODEL``).

A pinned candidate (a model a job is using) is never chosen. When even
deleting every unpinned candidate is not enough, the plan says so with
``fits=False`` and names what holds the space: refusing is data here; the
shell raises ``CacheFull`` from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Rank(IntEnum):
    """Eviction order: lower ranks go first."""

    PARTIAL = 0
    ORPHAN = 1
    MODEL = 2


@dataclass(frozen=True, slots=True)
class Candidate:
    key: str  # the cache's id for the file (a sha256, or "partial:<sha256>")
    size: int  # bytes on disk
    rank: Rank
    last_used: int  # a logical use counter: higher is more recent
    pinned: bool = False
    label: str = ""  # how a person knows it, e.g. the model names; for messages


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    victims: tuple[Candidate, ...]  # delete these, in this order
    fits: bool  # False: even deleting every unpinned candidate is not enough
    held: tuple[Candidate, ...] = ()  # the pinned candidates, when it does not fit


def plan_eviction(
    candidates: list[Candidate], *, used: int, budget: int, need: int
) -> EvictionPlan:
    """The fewest cheapest victims that bring ``used + need`` within ``budget``.

    ``used`` counts every byte the cache is accountable for (files, partials
    and reservations for downloads in flight); ``candidates`` are the files
    among them that could be deleted.
    """
    excess = used + need - budget
    if excess <= 0:
        return EvictionPlan(victims=(), fits=True)
    victims: list[Candidate] = []
    for candidate in sorted(candidates, key=_eviction_order):
        if candidate.pinned:
            continue
        victims.append(candidate)
        excess -= candidate.size
        if excess <= 0:
            return EvictionPlan(victims=tuple(victims), fits=True)
    held = tuple(c for c in candidates if c.pinned)
    return EvictionPlan(victims=(), fits=False, held=held)


def _eviction_order(candidate: Candidate) -> tuple[int, int, str]:
    return (candidate.rank, candidate.last_used, candidate.key)
