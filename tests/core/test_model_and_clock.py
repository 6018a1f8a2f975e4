import asyncio
from dataclasses import replace

import pytest

from corral.core import InvalidSpec, Job, Node, Team, VirtualClock
from corral.core.events import Event, EventKind


def test_frozen_mappings_cannot_be_changed_behind_the_dataclass() -> None:
    labels = {"rack": "r1"}
    node = Node("n1", labels=labels)
    labels["rack"] = "r2"
    assert node.labels["rack"] == "r1"
    with pytest.raises(TypeError):
        node.labels["rack"] = "r3"  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"id": ""}, "id"),
        ({"id": "j", "replicas": 0}, "replicas"),
        ({"id": "j", "timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_jobs_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        Job(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_team_refuses_negative_quota() -> None:
    with pytest.raises(InvalidSpec, match="quota_gpus"):
        Team("a", quota_gpus=-1)


def test_virtual_clock_wakes_sleepers_in_deadline_order_without_sleeping() -> None:
    async def scenario() -> list[tuple[str, float]]:
        clock = VirtualClock()
        woke: list[tuple[str, float]] = []

        async def sleeper(name: str, seconds: float) -> None:
            await clock.sleep(seconds)
            woke.append((name, clock.now()))

        tasks = [asyncio.create_task(sleeper("late", 10)), asyncio.create_task(sleeper("early", 2))]
        await asyncio.sleep(0)
        while (deadline := clock.next_deadline()) is not None:
            clock.advance(deadline - clock.now())
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return woke

    assert asyncio.run(scenario()) == [("early", 2.0), ("late", 10.0)]


def test_a_numbered_event_is_the_event_with_its_seq() -> None:
    event = Event(EventKind.JOB_STARTED, 12.5, "job_1", "node-a", {"attempt": 2})
    numbered = event.numbered(41)
    assert numbered == replace(event, seq=41)
    assert (event.seq, numbered.seq) == (0, 41)  # the original is untouched
    assert numbered.data is event.data  # frozen already: shared, not copied
