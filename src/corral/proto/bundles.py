"""Several link messages in one stream write (``AgentBundle``, ``ServerBundle``).

Each message written on a gRPC stream costs both ends a trip through the gRPC
core, whatever its size; on a busy link that cost, not the bytes, is what the
agent and the server spend their time on. So each end writes what it has
queued as one bundle, then waits for the next: an idle link still sends each
message at once (a bundle of one is written as the message itself), a busy
one sends fewer, fuller writes. Either end bundles only when the other said
it reads bundles (``Hello.bundles``, ``Welcome.bundles``): an older peer gets
one message per write, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from corral.proto.gen.corral.v1 import agent_pb2 as pb

BUNDLE_BYTES = 32 * 1024
"""A bundle stops growing past this size: half the smallest message limit either end may
be set to (64 KiB), so a bundle never fails where its parts would pass, and still a
hundred or so assignments or updates per write. A larger message travels on its own."""

M = TypeVar("M", pb.AgentMessage, pb.ServerMessage)


def pack(
    messages: Sequence[M], wrap: Callable[[Sequence[M]], M], limit: int = BUNDLE_BYTES
) -> list[M]:
    """``messages`` as few writes: runs of small ones wrapped together, in order."""
    if len(messages) < 2:
        return list(messages)
    out: list[M] = []
    run: list[M] = []
    size = 0
    for msg in messages:
        n = msg.ByteSize()
        if run and size + n > limit:
            out.append(_one(run, wrap))
            run, size = [], 0
        run.append(msg)
        size += n
    out.append(_one(run, wrap))
    return out


def _one(run: list[M], wrap: Callable[[Sequence[M]], M]) -> M:
    return run[0] if len(run) == 1 else wrap(run)


def agent_bundle(messages: Sequence[pb.AgentMessage]) -> pb.AgentMessage:
    return pb.AgentMessage(bundle=pb.AgentBundle(messages=messages))


def server_bundle(messages: Sequence[pb.ServerMessage]) -> pb.ServerMessage:
    return pb.ServerMessage(bundle=pb.ServerBundle(messages=messages))


def unpack_agent(msg: pb.AgentMessage) -> Sequence[pb.AgentMessage]:
    """The messages ``msg`` carries: its bundle's, or itself."""
    return msg.bundle.messages if msg.HasField("bundle") else (msg,)


def unpack_server(msg: pb.ServerMessage) -> Sequence[pb.ServerMessage]:
    """The messages ``msg`` carries: its bundle's, or itself."""
    return msg.bundle.messages if msg.HasField("bundle") else (msg,)
