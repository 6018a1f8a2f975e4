"""Both ends of the gRPC link in one process: the real client and server over loopback,
with a recording stand-in for the server's inbound side. Fast, so the reconnect and
resend paths are checked on every run."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from corral.agent.executors.base import Executor
from corral.agent.executors.command import CommandExecutor
from corral.agent.executors.python import PythonExecutor
from corral.agent.executors.scripted import ScriptedExecutor
from corral.agent.fingerprint import FakeGpus
from corral.agent.link import LinkClient, LinkSettings, parse_server
from corral.agent.supervisor import Supervisor
from corral.agent.wire import Identity
from corral.core import Unauthenticated, WallClock
from corral.core.errors import LinkError
from corral.core.model import Gpu, JobKind
from corral.core.states import StopReason
from corral.server.agentlink.base import (
    Ack,
    Assignment,
    HelloReply,
    Inventory,
    JobWork,
    ResultBlob,
    Running,
    Standing,
    StopOrder,
)
from corral.server.agentlink.grpc_link import GrpcLink
from corral.server.blobs import LocalBlobStore
from corral.server.settings import AgentLinkSettings

TOKEN = "good-token"


class Inbound:
    """Records what the agent said; ``fail_*`` make the next such call fail once."""

    def __init__(self) -> None:
        self.hellos: list[tuple[Inventory, list[Running]]] = []
        self.calls: list[tuple[str, Any]] = []
        self.results: list[ResultBlob] = []
        self.uploads_taken: list[str] = []  # results the server took from uploads
        self.keys: list[str] = []  # the node key of each connection
        self.uploaders: list[tuple[str, str]] = []  # (node, key) each upload named
        self.fail_finished = 0
        self.fail_heartbeat = 0

    async def authenticate(self, token: str) -> Inbound:
        if token != TOKEN:
            raise Unauthenticated("unknown token")
        return self  # the admission too: its streams are tied to nothing

    @property
    def token_id(self) -> str:
        return "tok_test"

    def hold(self, node: str, end: Callable[[str], bool]) -> Callable[[], None]:
        return lambda: None

    async def hello(self, inventory: Inventory, running: Sequence[Running]) -> HelloReply:
        self.hellos.append((inventory, list(running)))
        return HelloReply(heartbeat_s=0.05)

    async def heartbeat(self, node: str, gpus: Sequence[Gpu] | None = None) -> None:
        self.calls.append(("heartbeat", node))
        if self.fail_heartbeat:
            self.fail_heartbeat -= 1
            raise LinkError(f"node {node} was marked lost: say hello again")

    async def started(self, node: str, allocation_id: str, attempt: int) -> Ack:
        self.calls.append(("started", allocation_id))
        return Ack.ACCEPTED

    async def ready(self, node: str, allocation_id: str, attempt: int) -> Ack:
        self.calls.append(("ready", allocation_id))
        return Ack.ACCEPTED

    async def progress(self, node: str, allocation_id: str, attempt: int, fraction: float,
                       **kw: Any) -> Ack:  # fmt: skip
        self.calls.append(("progress", fraction))
        return Ack.ACCEPTED

    async def preview(self, node: str, allocation_id: str, attempt: int, job_id: str,
                      data: bytes, content_type: str = "image/png") -> Ack:  # fmt: skip
        self.calls.append(("preview", job_id))
        return Ack.ACCEPTED

    async def log(self, node: str, allocation_id: str, attempt: int, lines: Sequence[str],
                  **kw: Any) -> Ack:  # fmt: skip
        self.calls.append(("log", list(lines)))
        return Ack.ACCEPTED

    async def checkpoint(self, node: str, allocation_id: str, attempt: int, ref: str,
                         **kw: Any) -> Ack:  # fmt: skip
        self.calls.append(("checkpoint", ref))
        return Ack.ACCEPTED

    async def ran(self, node: str, allocation_id: str, attempt: int,
                  results: Sequence[ResultBlob], **_: Any) -> tuple[Ack, Ack]:  # fmt: skip
        started = await self.started(node, allocation_id, attempt)
        return started, await self.finished(node, allocation_id, attempt, results)

    async def finished(self, node: str, allocation_id: str, attempt: int,
                       results: Sequence[ResultBlob], **_: Any) -> Ack:  # fmt: skip
        if self.fail_finished:
            self.fail_finished -= 1
            raise RuntimeError("the store is down")
        self.calls.append(("finished", allocation_id))
        already = any(r.job_id == results[0].job_id for r in self.results) if results else False
        self.results.extend(results)
        return Ack.DUPLICATE if already else Ack.ACCEPTED

    async def failed(self, node: str, allocation_id: str, attempt: int, error: str, *,
                     retryable: bool, **_: Any) -> Ack:  # fmt: skip
        self.calls.append(("failed", (error, retryable)))
        return Ack.ACCEPTED

    async def stopped(self, node: str, allocation_id: str, attempt: int) -> Ack:
        return Ack.ACCEPTED

    async def may_fetch(self, allocation_id: str, attempt: int, blob_id: str) -> bool:
        return True

    async def claim(self, node: str, key: str) -> None:
        self.keys.append(key)

    async def uploads_read(self, allocation_id: str, blob_ids: Sequence[str]) -> None:
        self.uploads_taken.extend(blob_ids)

    async def upload_standing(
        self, node: str, key: str, allocation_id: str, attempt: int
    ) -> Standing:
        self.uploaders.append((node, key))
        return Standing.LIVE

    def kinds(self) -> list[str]:
        return [k for k, _ in self.calls]


class Pair:
    def __init__(self, link: GrpcLink, inbound: Inbound, agent: LinkClient) -> None:
        self.link, self.inbound, self.agent = link, inbound, agent

    async def until(self, probe: Any, timeout: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not probe():
            assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
            await asyncio.sleep(0.01)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    clock = WallClock()
    inbound = Inbound()
    link = GrpcLink(AgentLinkSettings(port=0, max_blob_bytes=4096, upload_idle_s=0.05))
    address = await link.start(inbound, LocalBlobStore(tmp_path / "blobs"), clock)
    executors: dict[str, Executor] = {
        "scripted": ScriptedExecutor(clock),
        "python": PythonExecutor(huge, clock),
        "medium": PythonExecutor(medium, clock),
        "command": CommandExecutor(clock),
    }
    supervisor = Supervisor(executors, clock, default="scripted")
    settings = LinkSettings(token=TOKEN, inline_bytes=64, backoff_base_s=0.02, backoff_cap_s=0.1)
    targets = [parse_server(f"127.0.0.1:{_dead_port()}"), parse_server(address)]  # one is down
    agent = LinkClient(targets, settings, supervisor, Identity("n1", 4, backends=("scripted",)),
                       FakeGpus.parse("1x RTX 4090 24GiB"), clock,
                       results_root=tmp_path / "results")  # fmt: skip
    running = asyncio.create_task(agent.run())
    try:
        yield Pair(link, inbound, agent)
    finally:
        running.cancel()  # even mid-dial to the dead server (this once hung: test_link_cancel.py)
        await asyncio.gather(running, return_exceptions=True)
        await link.close(0)  # nothing of grpc.aio outlives this test's event loop
        assert running.cancelled(), running.exception()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def medium(ctx: object) -> bytes:
    """A handler whose result rides an upload (over ``inline_bytes``, under the limit)."""
    return b"m" * 1_000


def huge(ctx: object) -> bytes:
    """A handler whose result is larger than the server takes (``max_blob_bytes``)."""
    return b"x" * 10_000


def work(alloc: str, *jobs: str, backend: str | None = None, **payload: object) -> Assignment:
    body = {"steps": 2, "step_s": 0.01, **payload}
    return Assignment(
        alloc, 1, "n1", tuple(JobWork(j, JobKind.SAMPLE, body, backend=backend) for j in jobs)
    )


@pytest.mark.anyio
async def test_the_agent_moves_past_a_dead_server_says_hello_and_runs_a_batch(pair: Pair) -> None:
    await pair.until(pair.agent.connected.is_set)
    [(inventory, running)] = pair.inbound.hellos
    assert inventory.node == "n1"
    assert [g.model for g in inventory.gpus] == ["RTX 4090"]
    assert running == []
    await pair.link.assign("n1", work("al-1", "j1", "j2"))
    await pair.until(lambda: "finished" in pair.inbound.kinds())
    assert [(r.job_id, r.name) for r in pair.inbound.results] == [
        ("j1", "result.txt"),
        ("j2", "result.txt"),
    ]
    assert pair.inbound.results[0].data.startswith(b"j1: scripted-model")  # uploaded: > 64 B
    await pair.until(lambda: pair.agent.supervisor.held() == [])  # acknowledged, forgotten
    assert "preview" in pair.inbound.kinds()
    assert ["[agent] the agent changed the request: model=scripted-model"] in [
        v for k, v in pair.inbound.calls if k == "log"
    ]


@pytest.mark.anyio
async def test_an_unacknowledged_result_is_held_and_resent_after_a_reconnect(pair: Pair) -> None:
    await pair.until(pair.agent.connected.is_set)
    pair.inbound.fail_finished = 1  # the server breaks the stream instead of acking
    await pair.link.assign("n1", work("al-2", "j3"))
    await pair.until(lambda: len(pair.inbound.hellos) == 2)
    assert pair.inbound.hellos[1][1] == [Running("al-2", 1)]  # held, so not declared lost
    await pair.until(lambda: "finished" in pair.inbound.kinds())
    assert [r.job_id for r in pair.inbound.results] == ["j3"]
    await pair.until(lambda: pair.agent.supervisor.held() == [])


@pytest.mark.anyio
async def test_a_node_declared_lost_says_hello_again(pair: Pair) -> None:
    await pair.until(pair.agent.connected.is_set)
    pair.inbound.fail_heartbeat = 1
    await pair.until(lambda: pair.agent.sessions == 2)  # welcomed again (the server's side
    assert len(pair.inbound.hellos) == 2  # records the hello before the agent reads the Welcome)


@pytest.mark.anyio
async def test_stop_orders_reach_the_running_work(pair: Pair) -> None:
    await pair.until(pair.agent.connected.is_set)
    await pair.link.assign("n1", work("al-3", "j4", steps=10_000, step_s=0.01))
    await pair.until(lambda: "progress" in pair.inbound.kinds())
    await pair.link.stop("n1", StopOrder("al-3", StopReason.CANCEL, 1.0))
    await pair.until(lambda: "failed" in pair.inbound.kinds())
    [(error, retryable)] = [v for k, v in pair.inbound.calls if k == "failed"]
    assert error.startswith("cancelled")
    assert retryable is False
    await pair.link.set_intake("n1", open=False)
    await pair.until(lambda: not pair.agent.supervisor.intake_open)


@pytest.mark.anyio
async def test_a_node_without_a_stream_is_a_link_error(pair: Pair) -> None:
    with pytest.raises(LinkError, match="not connected"):
        await pair.link.assign("nobody", work("al-4", "j5"))


@pytest.mark.anyio
async def test_a_result_uploaded_is_passed_on_by_reference_and_its_upload_released(
    pair: Pair,
) -> None:
    await pair.until(pair.agent.connected.is_set)
    await pair.link.assign("n1", work("al-6", "j7", backend="medium"))
    await pair.until(lambda: "finished" in pair.inbound.kinds())
    [result] = pair.inbound.results
    assert result.data == b"", "never read into the server's memory"
    assert result.upload is not None
    assert result.size == 1_000
    assert result.upload.sha256 == hashlib.sha256(b"m" * 1_000).hexdigest()
    assert set(pair.inbound.uploaders) == {("n1", "")}, "every upload named its node"
    await pair.until(lambda: pair.agent.supervisor.held() == [])
    await pair.until(lambda: pair.inbound.uploads_taken != [])  # upload_idle_s later
    [taken] = pair.inbound.uploads_taken  # copied into the result: the server drops it
    assert taken.startswith("uploads/al-6/1/")


@pytest.mark.anyio
async def test_a_result_file_is_uploaded_from_its_file_and_deleted_once_acknowledged(
    pair: Pair, tmp_path: Path
) -> None:
    await pair.until(pair.agent.connected.is_set)
    script = 'head -c 3000 /dev/zero | tr "\\0" f > "$CORRAL_OUTPUT_DIR/weights.bin"'
    await pair.link.assign(
        "n1", work("al-8", "j9", backend="command", command=["sh", "-c", script])
    )
    await pair.until(lambda: "finished" in pair.inbound.kinds())
    [result] = pair.inbound.results
    assert result.upload is not None, "over inline_bytes: uploaded"
    assert result.upload.sha256 == hashlib.sha256(b"f" * 3000).hexdigest()
    await pair.until(lambda: pair.agent.supervisor.held() == [])
    assert not (tmp_path / "results" / "al-8").exists(), "the file went once the end was acked"


@pytest.mark.anyio
async def test_a_result_the_server_refuses_becomes_a_failure_not_a_retry_loop(pair: Pair) -> None:
    await pair.until(pair.agent.connected.is_set)
    await pair.link.assign("n1", work("al-5", "j6", backend="python"))
    await pair.until(lambda: "failed" in pair.inbound.kinds())
    [(error, retryable)] = [v for k, v in pair.inbound.calls if k == "failed"]
    assert "refused a result" in error
    assert "larger than the limit" in error
    assert retryable is False
    assert pair.agent.sessions == 1  # no reconnect storm
    await pair.until(lambda: pair.agent.supervisor.held() == [])


def replica(alloc: str, job: str, **payload: object) -> Assignment:
    """Replica 1 of a gang of two, meeting at 10.0.0.1."""
    one = work(alloc, job, **payload)
    return dataclasses.replace(
        one, replica=1, replicas=2, master_addr="10.0.0.1", master_port=29500
    )


@pytest.mark.anyio
async def test_a_gang_replica_says_ready_and_launches_only_on_the_go(pair: Pair) -> None:
    await pair.until(pair.agent.connected.is_set)
    await pair.link.assign("n1", replica("al-g", "jg"))
    await pair.until(lambda: "ready" in pair.inbound.kinds())
    await asyncio.sleep(0.2)  # time it would have had to start
    assert "started" not in pair.inbound.kinds(), "it waits for the rest of its gang"
    await pair.link.go("n1", "al-g", 1)
    await pair.link.go("n1", "al-g", 1)  # said again (resync): ignored
    await pair.until(lambda: "finished" in pair.inbound.kinds())
    kinds = pair.inbound.kinds()
    assert kinds.index("ready") < kinds.index("started") < kinds.index("finished")
    assert kinds.count("started") == 1


@pytest.mark.anyio
async def test_a_gang_replica_stopped_while_it_waits_never_launches(pair: Pair) -> None:
    await pair.until(pair.agent.connected.is_set)
    await pair.link.assign("n1", replica("al-h", "jh"))
    await pair.until(lambda: "ready" in pair.inbound.kinds())
    await pair.link.stop("n1", StopOrder("al-h", StopReason.PREEMPT, 1.0))
    await pair.until(lambda: "failed" in pair.inbound.kinds())
    assert "started" not in pair.inbound.kinds()
    [(error, retryable)] = [v for k, v in pair.inbound.calls if k == "failed"]
    assert error.startswith("preempted")
    assert retryable
