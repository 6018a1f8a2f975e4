"""The world's observer: an ``Observing`` is called as itself, any other observer (a
duck-typed one, as ``bench/sim_plans.py``'s wrapper is) through a relay that passes on
every event, and no observer is one that does nothing."""

from __future__ import annotations

from corral.core import Allocation, Job, Node, ResourceRequest, Team
from corral.sim.observing import Observing, observing
from corral.sim.policies import Kept


class Recorder:
    """An observer that is not an ``Observing``: records the events it is told."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def submitted(self, job: Job) -> None:
        self.seen.append(("submitted", job))

    def withdrawn(self, job_id: str) -> None:
        self.seen.append(("withdrawn", job_id))

    def started(self, alloc: Allocation, expected_end: float | None) -> None:
        self.seen.append(("started", (alloc, expected_end)))

    def ended(self, alloc_id: str) -> None:
        self.seen.append(("ended", alloc_id))

    def teams_changed(self, teams: tuple[Team, ...]) -> None:
        self.seen.append(("teams_changed", teams))

    def nodes_changed(self, nodes: tuple[Node, ...]) -> None:
        self.seen.append(("nodes_changed", nodes))


def test_a_duck_typed_observer_is_told_every_event_through_the_relay() -> None:
    recorder = Recorder()
    relay = observing(recorder)
    assert relay is not recorder
    assert isinstance(relay, Observing)
    job = Job("j1", resources=ResourceRequest(gpus=1))
    alloc = Allocation("a1", ("j1",), "node-1", gpu_indices=(0,), gpu_milli=1000)
    relay.submitted(job)
    relay.withdrawn("j1")
    relay.started(alloc, 12.5)
    relay.ended("a1")
    relay.teams_changed(())
    relay.nodes_changed(())
    assert recorder.seen == [
        ("submitted", job),
        ("withdrawn", "j1"),
        ("started", (alloc, 12.5)),
        ("ended", "a1"),
        ("teams_changed", ()),
        ("nodes_changed", ()),
    ]


def test_an_observing_is_called_as_itself_and_none_observes_nothing() -> None:
    base = Observing()
    assert observing(base) is base
    assert type(observing(None)) is Observing
    assert issubclass(Kept, Observing)  # corral's kept scheduler: called directly
