"""A hand-driven agent speaking the wire protocol directly, to check the server's side of it.

Where the real agent always does the right thing, this one can send what a
confused or stale agent would: a result for an attempt that was requeued,
the same result twice, an upload cut off half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from corral.proto import caller
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.proto.gen.corral.v1 import agent_pb2_grpc as pb_grpc


class RawAgent:
    def __init__(
        self,
        address: str,
        token: str | None,
        node: str = "ghost",
        key: str = "",
        options: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.target = address.removeprefix("grpc://")
        self.options = list(options)  # the channel's (keepalive, say)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.node = node
        self.key = key  # the node key its hello binds the name to ("": none, an older agent)
        self.channel: Any = None
        self.call: Any = None
        self.inbox: asyncio.Queue[pb.ServerMessage] = asyncio.Queue()
        self._seq = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None

    @property
    def stub(self) -> pb_grpc.AgentLinkStub:
        return pb_grpc.AgentLinkStub(self.channel)

    async def connect(self, running: Sequence[tuple[str, int]] = ()) -> pb.Welcome:
        """Open a stream and say hello (holding ``running``: (allocation id, attempt) pairs)."""
        await self.close()
        self.channel = grpc.aio.insecure_channel(self.target, self.options)
        self.call = self.stub.Connect(metadata=self.metadata)
        held = [
            pb.RunningAllocation(allocation_id=a, attempt=n, observed="running") for a, n in running
        ]
        inventory = pb.Inventory(node=self.node, cpus=1, backends=["demo"], running=held)
        with contextlib.suppress(grpc.aio.AioRpcError):  # refused first: read() raises why
            await self.call.write(
                pb.AgentMessage(
                    seq=next(self._seq), hello=pb.Hello(inventory=inventory, node_key=self.key)
                )
            )
        first = await asyncio.wait_for(self.call.read(), 10)
        assert first.HasField("welcome"), first
        self._reader = asyncio.create_task(self._read())
        return first.welcome  # type: ignore[no-any-return]

    async def knock(self) -> Any:
        """Open a stream and send nothing: the server's first answer (a refusal raises).

        A refused agent must be told why before it says anything. Writing a hello
        first would race the refusal: a write that loses the race makes grpc.aio
        replace the server's status with its own INTERNAL error.
        """
        await self.close()
        self.channel = grpc.aio.insecure_channel(self.target, self.options)
        self.call = self.stub.Connect(metadata=self.metadata)
        return await asyncio.wait_for(self.call.read(), 10)

    async def _read(self) -> None:
        while (msg := await self.call.read()) is not grpc.aio.EOF:
            self.inbox.put_nowait(msg)

    async def expect(self, body: str, timeout: float = 10.0) -> Any:
        """The next server message with ``body`` (skipping others)."""
        while True:
            msg = await asyncio.wait_for(self.inbox.get(), timeout)
            if msg.WhichOneof("body") == body:
                return getattr(msg, body)

    async def beat(self) -> None:
        """Send one heartbeat (the node stays ready while they keep coming)."""
        await self.call.write(pb.AgentMessage(seq=next(self._seq), heartbeat=pb.Heartbeat()))

    async def update(self, allocation_id: str, attempt: int, **body: Any) -> str:
        """Send one update and return the server's ack status."""
        seq = next(self._seq)
        u = pb.AllocationUpdate(allocation_id=allocation_id, attempt=attempt, **body)
        await self.call.write(pb.AgentMessage(seq=seq, update=u))
        while True:
            ack = await self.expect("ack")
            if ack.seq == seq:
                return str(ack.status)

    async def upload(
        self, chunks: Iterator[pb.BlobChunk], *, node: str | None = None, key: str | None = None
    ) -> pb.BlobAck:
        """Upload as this agent's node (named and proven in the call's metadata, as agents
        do), or as the ``node`` and ``key`` given (an impostor)."""
        name, secret = node or self.node, self.key if key is None else key
        metadata = (*self.metadata, (caller.NODE, name.encode()))
        if secret:
            metadata = (*metadata, (caller.KEY, secret))
        ack: pb.BlobAck = await self.stub.UploadBlob(chunks, metadata=metadata)
        return ack

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self.call is not None:
            self.call.cancel()
        if self.channel is not None:
            await self.channel.close()
        self.channel = self.call = self._reader = None


def chunks(
    allocation_id: str, attempt: int, data: bytes, *, sha256: str = "", start: int = 0,
    stop: int | None = None, size: int = 64 * 1024, probe: bool = False,
) -> Iterator[pb.BlobChunk]:  # fmt: skip
    """``data[start:stop]`` as chunks (the last one flagged when it reaches the end)."""
    base = {"allocation_id": allocation_id, "attempt": attempt, "name": "big.bin", "sha256": sha256}
    if probe:
        yield pb.BlobChunk(**base)
        return
    end = len(data) if stop is None else stop
    for offset in range(start, end, size):
        piece = data[offset : min(offset + size, end)]
        yield pb.BlobChunk(**base, offset=offset, data=piece, last=offset + len(piece) >= len(data))
