"""Memory requests through the server: the HTTP API's validation and output (SQLite and
PostgreSQL), the node's reported memory, and a job too big for a node's free memory
waiting with ``insufficient_memory`` while one that fits runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from http_harness import Served, serve
from server_harness import ADMIN, World

from corral.core import GIB
from corral.core.states import JobState

pytestmark = pytest.mark.anyio

MIB = 1024**2


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path) as s:
        yield s


@pytest.mark.parametrize(
    ("memory", "want"),
    [
        ("512Mi", 512 * MIB),
        ("16Gi", 16 * GIB),
        ("1G", 10**9),
        ("1.5Gi", 3 * GIB // 2),
        ("64GiB", 64 * GIB),
        (4096, 4096),
        ("129e6", 129_000_000),
    ],
)
async def test_memory_quantities_are_stored_as_bytes(
    served: Served, memory: object, want: int
) -> None:
    r = await served.admin.post("/v1/jobs", json={"resources": {"gpus": 0, "memory": memory}})
    assert r.status_code == 201, r.text
    assert r.json()["resources"]["memory_bytes"] == want
    got = (await served.admin.get(f"/v1/jobs/{r.json()['id']}")).json()
    assert got["resources"]["memory_bytes"] == want  # as the store keeps it


async def test_a_job_without_memory_asks_for_none(served: Served) -> None:
    r = await served.admin.post("/v1/jobs", json={"resources": {"gpus": 0}})
    assert r.status_code == 201, r.text
    assert r.json()["resources"]["memory_bytes"] == 0


@pytest.mark.parametrize(
    ("memory", "hint"),
    [
        ("lots", "not a memory quantity"),
        ("16 parsecs", "not a memory quantity"),
        ("-1Gi", "not a memory quantity"),
        (-5, "must be a finite amount"),
        ("500m", "milli-bytes"),
        ("9000Ei", "more memory than any machine"),
        (True, ""),
        ([1], ""),
    ],
)
async def test_bad_memory_is_a_422_naming_the_field(served: Served, memory: Any, hint: str) -> None:
    r = await served.admin.post("/v1/jobs", json={"resources": {"memory": memory}})
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "resources.memory"
    assert hint in r.json()["message"]


async def test_memory_is_part_of_an_idempotent_request(served: Served) -> None:
    """A replay without memory is the same request; one naming memory is another."""
    body = {"resources": {"gpus": 0}, "idempotency_key": "k1"}
    first = await served.admin.post("/v1/jobs", json=body)
    again = await served.admin.post("/v1/jobs", json=body)
    assert first.status_code == 201, first.text
    assert again.status_code == 200, again.text
    other = await served.admin.post(
        "/v1/jobs", json={"resources": {"gpus": 0, "memory": "1Gi"}, "idempotency_key": "k1"}
    )
    assert other.status_code == 409


async def test_a_job_too_big_for_free_memory_waits_and_one_that_fits_runs(world: World) -> None:
    agent = await world.agent("box", gpus=2, cpus=8, memory_bytes=24 * GIB)
    big = await world.submit_many([{"resources": {"gpus": 1, "memory": "16Gi"}}] * 2)
    await world.cycle()
    given = await agent.next_assignment()
    assert given.memory_bytes == 16 * GIB
    states = sorted([(await world.job(r.job.id)).state.value for r in big])
    assert states == ["placed", "queued"]  # the other waits beside a free GPU: 8 GiB free
    (entry,), _ = await world.plane.queue.queue(ADMIN, 10)
    assert entry.unplaced is not None
    assert [r.code.value for r in entry.unplaced.reasons] == ["insufficient_memory"]
    assert "not enough free memory for 16 GiB" in entry.unplaced.summary()
    small = (await world.submit_many([{"resources": {"gpus": 1, "memory": "8Gi"}}]))[0]
    await world.cycle()
    assert (await agent.next_assignment()).memory_bytes == 8 * GIB
    assert (await world.job(small.job.id)).state is JobState.PLACED
    snapshot = await world.plane.schedule.snapshot()
    assert sorted(a.memory_bytes for a in snapshot.allocations) == [8 * GIB, 16 * GIB]
    assert snapshot.nodes[0].memory_bytes == 24 * GIB


async def test_a_node_that_reports_no_memory_never_runs_a_memory_request(world: World) -> None:
    await world.agent("old", gpus=1)  # an agent from before memory requests reports none
    (rec,) = await world.submit_many([{"resources": {"gpus": 1, "memory": "1Gi"}}])
    await world.cycle()
    assert (await world.job(rec.job.id)).state is JobState.QUEUED
    (entry,), _ = await world.plane.queue.queue(ADMIN, 10)
    assert entry.unplaced is not None
    assert entry.unplaced.reasons[0].code.value == "insufficient_memory"
    assert entry.unplaced.remedy.value == "none"
