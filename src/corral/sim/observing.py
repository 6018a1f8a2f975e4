"""What the world tells its observer (a kept scheduler is one): every change it makes to
what a snapshot holds.

``Observer`` is the protocol any object may follow. ``Observing`` is the same seven methods
as a base class: the world holds its observer as one (``observing`` wraps any other in a
relay), since compiled calls through a base class are direct, and a kept scheduler is
told four events per job.
"""

from __future__ import annotations

from typing import Protocol

from corral.core.model import Allocation, Job, Node, Team


class Observer(Protocol):
    """Told every change the world makes to what a snapshot holds (a kept scheduler is)."""

    def submitted(self, job: Job) -> None: ...  # queued (a new job, or a requeued one)

    def withdrawn(self, job_id: str) -> None: ...  # left the queue (placed)

    def started(self, alloc: Allocation, expected_end: float | None) -> None: ...

    def ended(self, alloc_id: str) -> None: ...  # finished, preempted, or the run ended

    def reflagged(self, alloc_id: str, borrowed: bool) -> None: ...  # its borrowed flag moved

    def teams_changed(self, teams: tuple[Team, ...]) -> None: ...

    def nodes_changed(self, nodes: tuple[Node, ...]) -> None: ...  # joined, drained, removed


class Observing:
    """An ``Observer`` as a base class; this one is told everything and does nothing."""

    def submitted(self, job: Job) -> None:
        pass

    def withdrawn(self, job_id: str) -> None:
        pass

    def started(self, alloc: Allocation, expected_end: float | None) -> None:
        pass

    def ended(self, alloc_id: str) -> None:
        pass

    def reflagged(self, alloc_id: str, borrowed: bool) -> None:
        pass

    def teams_changed(self, teams: tuple[Team, ...]) -> None:
        pass

    def nodes_changed(self, nodes: tuple[Node, ...]) -> None:
        pass


def observing(observer: Observer | None) -> Observing:
    """``observer`` as an ``Observing``: itself when it is one, else a relay to it (none:
    one that does nothing)."""
    if observer is None:
        return Observing()
    if isinstance(observer, Observing):
        return observer
    return _Relay(observer)


class _Relay(Observing):
    """Passes every change on to an observer that is not an ``Observing`` (duck-typed)."""

    def __init__(self, to: Observer) -> None:
        self._to = to

    def submitted(self, job: Job) -> None:
        self._to.submitted(job)

    def withdrawn(self, job_id: str) -> None:
        self._to.withdrawn(job_id)

    def started(self, alloc: Allocation, expected_end: float | None) -> None:
        self._to.started(alloc, expected_end)

    def ended(self, alloc_id: str) -> None:
        self._to.ended(alloc_id)

    def reflagged(self, alloc_id: str, borrowed: bool) -> None:
        self._to.reflagged(alloc_id, borrowed)

    def teams_changed(self, teams: tuple[Team, ...]) -> None:
        self._to.teams_changed(teams)

    def nodes_changed(self, nodes: tuple[Node, ...]) -> None:
        self._to.nodes_changed(nodes)
