"""A node's GPU topology, as its agent reports it, and the GPUs a multi-GPU job gets."""

from __future__ import annotations

from pathlib import Path

import pytest
from http_harness import eventually, serve
from server_harness import ADMIN, World

from corral.core.model import Gpu
from corral.server.agentlink.base import Inventory
from corral.server.agentlink.inprocess import StubAgent

pytestmark = pytest.mark.anyio

GIB = 1 << 30
# Two sockets, two GPUs each; one NVLink bridge joins GPU 1 and GPU 2 across them.
ROWS = (
    ("", "same_socket", "cross_socket", "cross_socket"),
    ("same_socket", "", "nvlink", "cross_socket"),
    ("cross_socket", "nvlink", "", "same_socket"),
    ("cross_socket", "cross_socket", "same_socket", ""),
)


async def box(world: World, name: str, links: bool = True) -> StubAgent:
    cards = tuple(
        Gpu(i, "A100", 80 * GIB, numa=i // 2 if links else -1, links=ROWS[i] if links else ())
        for i in range(4)
    )
    agent = StubAgent(world.plane.agents, world.link, Inventory(node=name, gpus=cards, cpus=32))
    await agent.connect()
    return agent


async def test_the_topology_is_kept_with_the_node(world: World) -> None:
    await box(world, "n1")
    view = await world.plane.nodes.get(ADMIN, "n1")
    gpus = view.record.node.gpus
    assert [g.numa for g in gpus] == [0, 0, 1, 1]
    assert gpus[1].links == ROWS[1]


async def test_the_cpus_of_each_numa_node_are_kept_with_the_node(world: World) -> None:
    cards = tuple(Gpu(i, "A100", 80 * GIB, numa=i // 2, links=ROWS[i]) for i in range(4))
    numa = ((0, 6.5), (1, 9.5))
    inv = Inventory(node="n1", gpus=cards, cpus=16, numa_cpus=numa)
    await StubAgent(world.plane.agents, world.link, inv).connect()
    assert (await world.plane.nodes.get(ADMIN, "n1")).record.node.numa_cpus == numa


@pytest.mark.parametrize(
    ("first", "gpus", "want"),
    [
        (None, 2, (1, 2)),  # the NVLink pair, though it spans the sockets
        (None, 3, (0, 1, 2)),  # the pair, and a socket-mate of one of them
        (0, 2, (1, 2)),  # GPU 0 taken: still the pair, not the first two free
    ],
)
async def test_a_multi_gpu_job_gets_the_closest_free_gpus(
    world: World, first: int | None, gpus: int, want: tuple[int, ...]
) -> None:
    agent = await box(world, "n1")
    if first is not None:  # a one-GPU job takes the first free GPU
        await world.submit(resources={"gpus": 1})
        await world.cycle()
        assert (await agent.next_assignment()).gpu_indices == (first,)
    await world.submit(resources={"gpus": gpus})
    await world.cycle()
    assert (await agent.next_assignment()).gpu_indices == want


async def test_without_a_topology_gpus_go_in_index_order(world: World) -> None:
    agent = await box(world, "n1", links=False)
    await world.submit(resources={"gpus": 2})
    await world.cycle()
    assert (await agent.next_assignment()).gpu_indices == (0, 1)


async def test_the_job_page_shows_the_gpus_chosen_and_how_they_are_linked(
    tmp_path: Path,
) -> None:
    async with serve(str(tmp_path / "c.db"), tmp_path) as s:
        cards = tuple(Gpu(i, "A100", 80 * GIB, numa=i // 2, links=ROWS[i]) for i in range(4))
        agent = StubAgent(s.plane.agents, s.link, Inventory(node="n1", gpus=cards, cpus=32))
        await agent.connect()
        r = await s.admin.post("/v1/jobs", json={"kind": "train", "resources": {"gpus": 2}})
        job_id = r.json()["id"]
        await agent.next_assignment(timeout=10)

        async def placed() -> list[dict[str, object]] | None:
            return (await s.admin.get(f"/v1/jobs/{job_id}")).json()["placement"] or None

        (where,) = await eventually(placed)
        assert (where["node"], where["gpu_indices"]) == ("n1", [1, 2])
        assert where["topology"] == "GPUs 1,2 (nvlink) on NUMA node 0,1"
        assert where["observed"] == "pending"


async def test_a_gpu_jobs_cpus_come_from_its_gpus_numa_node(tmp_path: Path) -> None:
    async with serve(str(tmp_path / "c.db"), tmp_path) as s:
        cards = tuple(Gpu(i, "A100", 80 * GIB, numa=i // 2, links=ROWS[i]) for i in range(4))
        numa = ((0, 4.0), (1, 12.0))  # CPU slots of NUMA node 0 and node 1
        inv = Inventory(node="n1", gpus=cards, cpus=16, numa_cpus=numa)
        agent = StubAgent(s.plane.agents, s.link, inv)
        await agent.connect()
        view = await s.plane.nodes.get(ADMIN, "n1")
        assert view.record.node.numa_cpus == numa
        first = {"kind": "train", "resources": {"gpus": 1, "cpus": 8}}
        assert (await s.admin.post("/v1/jobs", json=first)).status_code == 201
        # GPU 0 is free, but only NUMA node 1 has 8 CPUs: the first GPU there
        assert (await agent.next_assignment(timeout=10)).gpu_indices == (2,)
        # 8 CPUs are left, 4 beside each node's free GPUs: 6 fit the node, no NUMA node
        second = {"kind": "train", "resources": {"gpus": 1, "cpus": 6}}
        job_id = (await s.admin.post("/v1/jobs", json=second)).json()["id"]

        async def explained() -> dict[str, object] | None:
            queue = (await s.admin.get(f"/v1/jobs/{job_id}")).json()["queue"]
            return queue if queue and queue["reasons"] else None

        queue = await eventually(explained)
        assert [r["code"] for r in queue["reasons"]] == ["insufficient_numa_cpus"]
        assert "NUMA node" in queue["summary"]
        assert (await s.admin.get(f"/v1/jobs/{job_id}")).json()["state"] == "queued"
