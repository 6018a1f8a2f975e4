"""Several link messages per stream write: packing keeps order and size, unpacking gives
back exactly what was packed, and the link lets a start wait briefly for its end."""

from __future__ import annotations

import asyncio

import pytest

from corral.agent.checkpoints import CheckpointCourier
from corral.agent.executors.base import Checkpoint, Failed, Started
from corral.agent.link import LinkSettings
from corral.agent.orders import Done, Report
from corral.agent.sender import Queued, Sender, linger, open_starts
from corral.proto import bundles
from corral.proto.gen.corral.v1 import agent_pb2 as pb


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def update(seq: int, size: int = 0) -> pb.AgentMessage:
    u = pb.AllocationUpdate(allocation_id=f"a{seq}", attempt=1)
    u.log.line = "x" * size
    return pb.AgentMessage(seq=seq, update=u)


def test_one_message_travels_as_itself() -> None:
    msg = update(1)
    assert bundles.pack([msg], bundles.agent_bundle) == [msg]
    assert list(bundles.unpack_agent(msg)) == [msg]


def test_small_messages_travel_together_in_order() -> None:
    msgs = [update(i) for i in range(1, 6)]
    [packed] = bundles.pack(msgs, bundles.agent_bundle)
    assert packed.WhichOneof("body") == "bundle"
    assert [m.seq for m in bundles.unpack_agent(packed)] == [1, 2, 3, 4, 5]


def test_a_bundle_stays_under_its_limit_and_a_large_message_goes_alone() -> None:
    limit = 1000
    msgs = [update(1, 300), update(2, 300), update(3, 300), update(4, 5000), update(5, 10)]
    packed = bundles.pack(msgs, bundles.agent_bundle, limit)
    seqs = [[m.seq for m in bundles.unpack_agent(p)] for p in packed]
    assert seqs == [[1, 2, 3], [4], [5]]
    assert all(p.ByteSize() <= limit for p in packed if p.HasField("bundle"))


def test_server_messages_bundle_the_same_way() -> None:
    msgs = [pb.ServerMessage(ack=pb.UpdateAck(seq=i, status="accepted")) for i in range(3)]
    [packed] = bundles.pack(msgs, bundles.server_bundle)
    assert [m.ack.seq for m in bundles.unpack_server(packed)] == [0, 1, 2]


@pytest.mark.anyio
async def test_a_start_waits_briefly_for_its_end_to_share_a_write() -> None:
    live: asyncio.Queue[Queued] = asyncio.Queue()
    batch: list[Queued] = [(1, Report("a1", 1, Started()))]
    asyncio.get_running_loop().call_soon(live.put_nowait, (2, Report("a1", 1, Done())))
    await linger(live, batch, linger_s=5.0)
    assert [seq for seq, _ in batch] == [1, 2]


@pytest.mark.anyio
async def test_a_start_alone_leaves_after_the_linger() -> None:
    live: asyncio.Queue[Queued] = asyncio.Queue()
    batch: list[Queued] = [(1, Report("a1", 1, Started()))]
    await linger(live, batch, linger_s=0.001)
    assert [seq for seq, _ in batch] == [1]


@pytest.mark.anyio
async def test_starts_wait_for_every_end_that_comes_soon() -> None:
    live: asyncio.Queue[Queued] = asyncio.Queue()
    batch: list[Queued] = [(1, Report("a1", 1, Started())), (2, Report("a2", 1, Started()))]
    loop = asyncio.get_running_loop()
    loop.call_soon(live.put_nowait, (3, Report("a1", 1, Done())))
    loop.call_later(0.01, live.put_nowait, (4, Report("a2", 1, Failed("boom", retryable=True))))
    loop.call_later(0.02, live.put_nowait, (5, Report("a3", 1, Started())))
    await linger(live, batch, linger_s=5.0)
    assert [seq for seq, _ in batch] == [1, 2, 3, 4], "every start has its end: no more waiting"


@pytest.mark.anyio
async def test_what_is_queued_with_an_open_start_leaves_after_the_linger() -> None:
    live: asyncio.Queue[Queued] = asyncio.Queue()
    batch: list[Queued] = [(1, Report("a0", 1, Done())), (2, Report("a1", 1, Started()))]
    asyncio.get_running_loop().call_soon(live.put_nowait, (3, Report("a2", 1, Done())))
    await linger(live, batch, linger_s=0.01)
    assert [seq for seq, _ in batch] == [1, 2, 3]
    assert open_starts(batch)
    assert not open_starts([(1, Report("a0", 1, Done()))])


class FakeCall:
    def __init__(self) -> None:
        self.written: list[pb.AgentMessage] = []

    async def write(self, msg: pb.AgentMessage) -> None:
        self.written.append(msg)


async def sent(bundling: bool) -> list[list[int]]:
    """What a sender writes for a job's start and end and a heartbeat, all queued at once."""
    courier = CheckpointCourier((), chunk_bytes=1024, max_bytes=1024)
    sender = Sender(LinkSettings(token="t"), {}, courier, ())
    sender.bundles = bundling
    live: asyncio.Queue[Queued] = asyncio.Queue()
    for item in [
        (1, Report("a1", 1, Started())),
        (2, Report("a1", 1, Done())),
        (3, pb.Heartbeat()),
    ]:
        live.put_nowait(item)
    call = FakeCall()
    task = asyncio.create_task(sender.run(call, None, live))
    while len(call.written) < (1 if bundling else 3):
        await asyncio.sleep(0.001)
    task.cancel()
    return [[m.seq for m in bundles.unpack_agent(msg)] for msg in call.written]


@pytest.mark.anyio
async def test_a_sender_bundles_what_is_queued_only_for_a_server_that_reads_bundles() -> None:
    assert await sent(True) == [[1, 2, 3]]
    assert await sent(False) == [[1], [2], [3]], "an older server: one message per write"


@pytest.mark.anyio
async def test_a_checkpoint_with_a_newer_one_queued_is_dropped_unsent() -> None:
    courier = CheckpointCourier((), chunk_bytes=1024, max_bytes=1024)
    reports = {
        1: Report("a1", 1, Checkpoint("", 5), job_id="j1"),
        2: Report("a2", 1, Checkpoint("", 7), job_id="j2"),
        3: Report("a1", 1, Checkpoint("", 10), job_id="j1"),
    }
    outbox = dict(reports)
    sender = Sender(LinkSettings(token="t"), outbox, courier, ())
    live: asyncio.Queue[Queued] = asyncio.Queue()
    for item in reports.items():
        live.put_nowait(item)
    call = FakeCall()
    task = asyncio.create_task(sender.run(call, None, live))
    while len(call.written) < 2:
        await asyncio.sleep(0.001)
    task.cancel()
    assert [m.seq for m in call.written] == [2, 3], "the step-5 checkpoint of j1 never went"
    assert [m.update.checkpoint.step for m in call.written] == [7, 10]
    assert sorted(outbox) == [2, 3], "nor waits for an acknowledgement"
