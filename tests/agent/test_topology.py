"""GPU topology: NUMA nodes and links (given, or read from a fake NVML), close GPU sets,
and a job's process pinned to its GPUs' NUMA nodes' CPUs."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from corral.agent.executors.base import Finished, JobWork, LogLine, Update
from corral.agent.executors.command import CommandExecutor
from corral.agent.fingerprint import GpuSnapshot, NvmlInventory
from corral.agent.testing import Harness, run_to_end
from corral.agent.topology import Topology, parse_cpulist, parse_fake
from corral.agent.wire import Identity, inventory
from corral.core import InvalidSpec, WallClock

# Two sockets, two GPUs each; one NVLink bridge joins GPU 1 and GPU 2 across them.
BOX = "numa=0,0,1,1; nvlink=1-2; cpus=0:0-7,1:8-15"


def test_a_fake_layout_names_each_pairs_link() -> None:
    t = parse_fake(BOX, 4)
    assert t.numa == (0, 0, 1, 1)
    assert [t.link(0, 1), t.link(1, 2), t.link(2, 1), t.link(0, 3)] == [
        "same_socket",
        "nvlink",
        "nvlink",
        "cross_socket",
    ]
    assert t.numa_cpus[1] == frozenset(range(8, 16))


@pytest.mark.parametrize(
    ("free", "count", "want"),
    [
        ((0, 1, 2, 3), 2, (1, 2)),  # NVLink first, even across sockets
        ((0, 1, 3), 2, (0, 1)),  # else one socket
        ((0, 2, 3), 2, (2, 3)),
        ((0, 1, 2, 3), 3, (0, 1, 2)),  # the NVLink pair and a socket-mate of one of them
        ((3, 0), 1, (0,)),
    ],
)
def test_the_closest_gpus_are_chosen(
    free: tuple[int, ...], count: int, want: tuple[int, ...]
) -> None:
    assert parse_fake(BOX, 4).closest(free, count) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("numa=0,1", "numa names 2 GPUs, the node has 4"),
        ("nvlink=0-9", "nvlink=0-9: no such pair of GPUs"),
        ("ring=0-1", "'ring=0-1': write numa=..."),
        ("numa=a,b,c,d", "numa='a,b,c,d': write numbers"),
    ],
)
def test_a_bad_fake_layout_is_refused_by_name(text: str, want: str) -> None:
    with pytest.raises(InvalidSpec, match="fake_topology") as caught:
        parse_fake(text, 4)
    assert want in str(caught.value)


def test_cpulists_read_as_the_kernel_writes_them() -> None:
    assert parse_cpulist("0-2,8,10-11\n") == frozenset({0, 1, 2, 8, 10, 11})


class FakeNvml:
    """The NVML calls topology reads: 3 GPUs, 0 and 1 NVLinked, 2 across the sockets."""

    class NVMLError(Exception):
        pass

    NVML_NVLINK_MAX_LINKS = 4

    @dataclass
    class Pci:
        busId: bytes

    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return self.Pci(f"00000000:0{h}:00.0".encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 50 if 2 in (a, b) else 10

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if h == 2 or link >= 2:
            raise self.NVMLError("not supported")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return self.Pci(f"00000000:0{1 - h}:00.0".encode())


def test_nvml_names_nvlink_switches_and_sockets() -> None:
    t = NvmlInventory(FakeNvml()).topology()  # type: ignore[arg-type]
    assert [t.link(0, 1), t.link(0, 2), t.link(1, 2)] == ["nvlink", "cross_socket", "cross_socket"]
    assert len(t.numa) == 3


def run(job: JobWork, topology: Topology) -> list[Update]:
    h = Harness(CommandExecutor(WallClock(), topology=topology), WallClock(), None)  # type: ignore[arg-type]
    return asyncio.run(run_to_end(h, job))  # type: ignore[arg-type]


AFFINITY = [
    sys.executable,
    "-c",
    "import os; print(sorted(os.sched_getaffinity(0)), os.environ['CORRAL_CPUS'])",
]


def test_a_job_runs_on_the_cpus_of_its_gpus_numa_node() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to tell the NUMA nodes apart")
    layout = parse_fake(f"numa=0,1; cpus=0:{cpus[0]},1:{cpus[-1]}", 2)
    updates = run(JobWork("al", 1, ("j",), payload={"command": AFFINITY}, gpu_indices=(1,)), layout)
    assert isinstance(updates[-1], Finished)
    lines = [u for u in updates if isinstance(u, LogLine)]
    assert LogLine("GPUs 1 (alone) on NUMA node 1", "agent") in lines
    assert LogLine(f"[{cpus[-1]}] {cpus[-1]}") in lines


def test_a_cpu_job_is_not_pinned() -> None:
    command = [sys.executable, "-c", "import os; print(os.environ.get('CORRAL_CPUS', 'free'))"]
    updates = run(JobWork("al", 1, ("j",), payload={"command": command}), parse_fake(BOX, 4))
    assert LogLine("free") in updates


@pytest.mark.parametrize(
    ("layout", "slots", "want"),
    [
        (BOX, 16, [(0, 8000), (1, 8000)]),  # as many slots as CPUs: each node its CPUs
        ("numa=0,1; cpus=0:0-3,1:4-11", 6, [(0, 2000), (1, 4000)]),  # --cpus 6: by share
        ("numa=0,1; cpus=0:0-2,1:3-5", 1, [(0, 500), (1, 500)]),
        ("numa=0,1,1; cpus=0:0,1:1-2", 1, [(0, 334), (1, 666)]),  # the rounding to the first
    ],
)
def test_the_hello_reports_each_numa_nodes_share_of_the_cpu_slots(
    layout: str, slots: float, want: list[tuple[int, int]]
) -> None:
    gpus = layout.split(";")[0].count(",") + 1
    identity = Identity("n", cpus=slots, topology=parse_fake(layout, gpus))
    hello = inventory(identity, GpuSnapshot(), [])
    assert [(n.numa_node, n.cpu_milli) for n in hello.numa_cpus] == want
    assert sum(m for _, m in want) == hello.cpu_milli


def test_without_a_topology_the_hello_reports_no_numa_cpus() -> None:
    assert not inventory(Identity("n", cpus=4), GpuSnapshot(), []).numa_cpus
