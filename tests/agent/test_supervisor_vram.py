"""The VRAM guard wired through the supervisor: a real subprocess that uses more
VRAM than its allocation reserved (per-process figures from the fake inventory,
as NVML would give them) is stopped with a clear error; its neighbour is not."""

from __future__ import annotations

import asyncio

from corral.agent.executors.base import Failed, JobWork
from corral.agent.executors.command import CommandExecutor
from corral.agent.fingerprint import FakeGpus
from corral.agent.orders import Order, Report
from corral.agent.supervisor import Supervisor
from corral.core import GIB, WallClock


def sleeper(alloc: str, vram_gib: int) -> Order:
    work = JobWork(alloc, 1, (f"job-{alloc}",), payload={"command": ["sleep", "30"]})
    return Order(alloc, 1, (work,), backend="command", gpu_indices=(0,), vram_bytes=vram_gib * GIB)


async def scenario() -> tuple[list[str], list[str], list[Report]]:
    clock = WallClock()
    sup = Supervisor({"command": CommandExecutor(clock)}, clock, default="command")
    reports: list[Report] = []
    sup.sink = reports.append
    gpus = FakeGpus.parse("1x RTX 4090 24GiB")
    assert sup.assign(sleeper("greedy", 4))
    assert sup.assign(sleeper("modest", 4))
    for _ in range(200):  # until both processes exist
        owners = sup.process_owners()
        if len(set(owners.values())) == 2:
            break
        await asyncio.sleep(0.02)
    pids = {alloc: pid for pid, alloc in owners.items()}
    gpus.use(pids["greedy"], 0, 10 * GIB)  # 10 GiB used, 4 GiB reserved
    gpus.use(pids["modest"], 0, 3 * GIB)
    first = sup.check_vram(gpus.snapshot(), owners)  # one reading is not enough (a spike)
    second = sup.check_vram(gpus.snapshot(), owners)
    for _ in range(500):
        if any(r.allocation_id == "greedy" and r.terminal for r in reports):
            break
        await asyncio.sleep(0.02)
    await sup.shutdown(grace_s=1.0)
    return first, second, reports


def test_an_allocation_over_its_vram_reservation_is_stopped_with_a_clear_error() -> None:
    first, second, reports = asyncio.run(scenario())
    assert first == []
    assert second == ["greedy"]
    [end] = [r for r in reports if r.allocation_id == "greedy" and r.terminal]
    assert isinstance(end.update, Failed)
    assert not end.update.retryable
    assert "VRAM" in end.update.error
    assert "reserved" in end.update.error
    modest_ends = [r for r in reports if r.allocation_id == "modest" and r.terminal]
    assert all("VRAM" not in getattr(r.update, "error", "") for r in modest_ends)
