"""A gang replica's process: the variables torch.distributed reads, and torchrun per node."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any

from corral.agent.executors.base import Failed, Finished, Gang, JobWork, LogLine, Update
from corral.agent.executors.command import CommandExecutor
from corral.agent.testing import Harness, run_to_end
from corral.agent.wire import order_from
from corral.core import WallClock
from corral.proto.gen.corral.v1 import agent_pb2 as pb

DUMP = [
    sys.executable,
    "-c",
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items()"
    " if 'RANK' in k or 'WORLD' in k or 'MASTER' in k}))",
]


def run(job: JobWork) -> list[Update]:
    h = Harness(CommandExecutor(WallClock()), WallClock(), None)  # type: ignore[arg-type]
    return asyncio.run(run_to_end(h, job))  # type: ignore[arg-type]


def env_of(updates: list[Update]) -> dict[str, str]:
    assert isinstance(updates[-1], Finished), updates[-1]
    found: dict[str, str] = json.loads(next(u.line for u in updates if isinstance(u, LogLine)))
    return found


def replica(
    rank: int, size: int, port: int = 29411, addr: str = "10.0.0.5", **payload: Any
) -> JobWork:
    return JobWork(
        f"al-{rank}",
        2,
        ("job-1",),
        payload={"command": DUMP} | payload,
        gang=Gang(rank, size, addr, port),
    )


def test_a_replica_gets_its_rank_the_world_size_and_the_master() -> None:
    env = env_of(run(replica(1, 3, env={"RANK": "7", "MASTER_PORT": "1"})))
    want = {
        "RANK": "1",
        "WORLD_SIZE": "3",
        "NODE_RANK": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29411",
    }
    assert {k: env[k] for k in want} == want, "the payload's env cannot move a rank"
    assert {k: env[f"CORRAL_{k}"] for k in want} == want


def test_a_lone_job_is_no_gang() -> None:
    env = env_of(run(JobWork("al", 1, ("job",), payload={"command": DUMP})))
    assert "CORRAL_RANK" not in env
    assert "CORRAL_MASTER_ADDR" not in env


def test_torchrun_launches_one_node_of_the_gang_each() -> None:
    """Two replicas, each its own torchrun with --node-rank: the workers meet at the
    master and get their global ranks from torchrun."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def node(rank: int) -> JobWork:
        return replica(rank, 2, port, "127.0.0.1", launcher="torchrun")

    async def both() -> list[list[Update]]:
        h = Harness(CommandExecutor(WallClock()), WallClock(), None)  # type: ignore[arg-type]
        return list(await asyncio.gather(run_to_end(h, node(0)), run_to_end(h, node(1))))  # type: ignore[arg-type]

    envs = [env_of(updates) for updates in asyncio.run(both())]
    assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]) for e in envs] == [
        ("0", "2", "0"),
        ("1", "2", "0"),
    ]
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}


def test_an_unknown_launcher_is_refused_by_name() -> None:
    terminal = run(replica(0, 2, launcher="mpirun"))[-1]
    assert isinstance(terminal, Failed)
    assert "payload.launcher: must be one of" in terminal.error


def test_the_assignment_names_the_replica_and_its_master() -> None:
    msg = pb.Assign(
        allocation_id="al",
        attempt=3,
        jobs=[pb.Work(job_id="j", kind="train")],
        replica=2,
        replicas=4,
        master_addr="10.1.2.3",
        master_port=29444,
    )
    (job,) = order_from(msg).jobs
    assert job.gang == Gang(2, 4, "10.1.2.3", 29444)
    lone = pb.Assign(allocation_id="al", attempt=1, jobs=[pb.Work(job_id="j")], replicas=1)
    assert order_from(lone).jobs[0].gang is None
