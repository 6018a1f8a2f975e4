"""Cancelling the agent's link ends it, wherever the cancel lands.

``LinkClient.run`` is cancelled on Ctrl-C (``run_agent``) and by every test that
starts one. The cases here drive it over a stand-in channel, so the cancel can
be made to land in the exact loop turn where it once got lost: together with
the dead server's answer to the hello. (Python 3.11's ``asyncio.wait_for``
returned that answer instead of the cancel; ``run`` then dialled on, and
whoever cancelled it waited forever.) No timing is involved: each case turns
the loop a fixed number of times and looks at the task.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.agent.checkpoints import CheckpointCourier
from corral.agent.executors.scripted import ScriptedExecutor
from corral.agent.fingerprint import FakeGpus
from corral.agent.link import LinkClient, LinkSettings, parse_server
from corral.agent.supervisor import Supervisor
from corral.agent.wire import Identity
from corral.core import WallClock
from corral.proto.gen.corral.v1 import agent_pb2 as pb

UNAVAILABLE = grpc.aio.AioRpcError(
    grpc.StatusCode.UNAVAILABLE,
    grpc.aio.Metadata(),
    grpc.aio.Metadata(),
    "failed to connect to all addresses",
)


class FakeCall:
    """The Connect call: writes succeed; a read waits for what the test gives it."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.cancelled = False

    async def write(self, message: object) -> None:
        return None

    async def read(self) -> Any:
        return await self.answer

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeChannel:
    """Stands in for ``grpc.aio.Channel``: counts opens and closes, hands out ``FakeCall``s."""

    def __init__(self, log: list[str], calls: list[Any], call: type[FakeCall] = FakeCall) -> None:
        self.log, self.calls, self.call = log, calls, call

    async def __aenter__(self) -> FakeChannel:
        self.log.append("open")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.log.append("close")

    def stream_stream(self, *args: object, **kwargs: object) -> Any:
        def connect(metadata: object = None) -> FakeCall:
            call = self.call()
            self.calls.append(call)
            return call

        return connect

    def stream_unary(self, *args: object, **kwargs: object) -> Any:
        return None

    unary_unary = unary_stream = stream_unary


def make_client(
    target: str = "127.0.0.1:9", reporter: object = None, dial: Any = None
) -> LinkClient:
    clock = WallClock()
    supervisor = Supervisor({"scripted": ScriptedExecutor(clock)}, clock, default="scripted")
    settings = LinkSettings(token="t", backoff_base_s=0.001, backoff_cap_s=0.001)
    return LinkClient(
        [parse_server(target)],
        settings,
        supervisor,
        Identity("n1", 4, backends=("scripted",)),
        FakeGpus.parse("1x RTX 4090 24GiB"),
        clock,
        reporter=reporter,  # type: ignore[arg-type]
        dial=dial,
    )


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def reading_the_welcome() -> tuple[asyncio.Task[None], list[str], list[FakeCall]]:
    """A ``run`` task parked on its first session's welcome read."""
    log: list[str] = []
    calls: list[FakeCall] = []
    client = make_client(dial=lambda target: FakeChannel(log, calls))
    task = asyncio.create_task(client.run())
    await turns()
    assert len(calls) == 1, "the client should be waiting for the Welcome"
    assert not calls[0].answer.done()
    return task, log, calls


def test_a_cancel_that_lands_with_the_dead_servers_answer_ends_the_link() -> None:
    async def scenario() -> None:
        task, log, calls = await reading_the_welcome()
        calls[0].answer.set_exception(UNAVAILABLE)  # the answer and the cancel, same turn
        task.cancel()
        await turns()
        assert task.cancelled(), "the cancel was lost and the link dialled on"
        assert len(calls) == 1
        assert log == ["open", "close"]
        assert calls[0].cancelled

    asyncio.run(scenario())


def test_a_cancel_that_lands_with_the_welcome_ends_the_link() -> None:
    async def scenario() -> None:
        task, log, calls = await reading_the_welcome()
        calls[0].answer.set_result(grpc.aio.EOF)  # the stream ended without a Welcome
        task.cancel()
        await turns()
        assert task.cancelled()
        assert log == ["open", "close"]

    asyncio.run(scenario())


def test_a_cancel_while_waiting_for_the_welcome_ends_the_link() -> None:
    async def scenario() -> None:
        task, log, calls = await reading_the_welcome()
        task.cancel()
        await turns()
        assert task.cancelled()
        assert log == ["open", "close"]
        assert calls[0].cancelled

    asyncio.run(scenario())


def test_a_silent_server_is_given_up_on_after_the_welcome_timeout_and_dialled_again() -> None:
    async def scenario() -> None:
        log: list[str] = []
        calls: list[FakeCall] = []
        client = make_client(dial=lambda target: FakeChannel(log, calls))
        client.settings = LinkSettings(token="t", welcome_timeout_s=0.0, backoff_base_s=0.001)
        task = asyncio.create_task(client.run())
        while len(calls) < 3:  # each read times out; each session closes its channel
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        assert log.count("open") == log.count("close") >= 3

    asyncio.run(scenario())


def test_a_cancel_while_the_sessions_tasks_wind_down_ends_the_session() -> None:
    """The stream ended (the reader returned) and another task is still stopping."""

    async def scenario() -> None:
        reporter = SlowToStop()
        calls: list[ScriptedCall] = []
        client = make_client(reporter=reporter, dial=lambda t: FakeChannel([], calls, ScriptedCall))
        task = asyncio.create_task(client.run())
        await turns()
        (call,) = calls
        call.answers.put_nowait(pb.ServerMessage(welcome=pb.Welcome()))
        call.answers.put_nowait(grpc.aio.EOF)  # the server ends the stream
        await reporter.stopping.wait()
        task.cancel()  # Ctrl-C, while the session's tasks are being cancelled
        reporter.release.set()
        await turns()
        assert task.cancelled(), "the cancel was swallowed with the tasks' own"
        assert len(calls) == 1, "the link dialled again"

    asyncio.run(scenario())


class ScriptedCall(FakeCall):
    """A Connect call whose reads return ``answers`` in turn."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: asyncio.Queue[Any] = asyncio.Queue()

    async def read(self) -> Any:
        return await self.answers.get()


class SlowToStop:
    """Stands in for the model cache's reporter: no models, and slow to stop once cancelled
    (its task is the last of the session's to end)."""

    models = None

    def __init__(self) -> None:
        self.stopping, self.release = asyncio.Event(), asyncio.Event()

    def reconnected(self) -> None:
        return None

    def status(self) -> pb.ModelStatus:
        return pb.ModelStatus()

    async def describe(self, status: pb.ModelStatus, now: float) -> None:
        return None

    async def wait_change(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopping.set()
            await self.release.wait()
            raise


def test_a_cancel_that_lands_as_the_link_comes_up_ends_a_checkpoint_download(
    tmp_path: Path,
) -> None:
    """A resuming job waits for the link to fetch its checkpoint; a stop lands as it connects."""

    async def scenario() -> None:
        connected = asyncio.Event()
        courier = CheckpointCourier((), chunk_bytes=1024, max_bytes=1024, connected=connected)
        into = tmp_path / "b1.tar"
        task = asyncio.create_task(courier.download(pb.BlobRequest(blob_id="b1"), into))
        await turns()
        connected.set()
        task.cancel()
        await turns()
        assert task.cancelled(), "the cancel was lost and the download went on"

    asyncio.run(scenario())


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("after", [0, 1, 2, 3, 5, 8, 13])
def test_a_real_link_dialling_a_dead_server_ends_when_cancelled(after: int) -> None:
    """The same over real grpc.aio: cancelled at various points of its dialling."""

    async def scenario() -> None:
        client = make_client(f"127.0.0.1:{_dead_port()}")
        task = asyncio.create_task(client.run())
        for _ in range(after):
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

    asyncio.run(scenario())
