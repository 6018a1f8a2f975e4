"""Which messages of an agent's bundle the gRPC servicer handles as one start-and-end pair."""

from __future__ import annotations

import pytest

from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.server.agentlink.grpc_service import paired


def started(seq: int, alloc: str, attempt: int = 1) -> pb.AgentMessage:
    update = pb.AllocationUpdate(allocation_id=alloc, attempt=attempt, started=pb.Started())
    return pb.AgentMessage(seq=seq, update=update)


def finished(seq: int, alloc: str, attempt: int = 1, **modified: str) -> pb.AgentMessage:
    update = pb.AllocationUpdate(
        allocation_id=alloc, attempt=attempt, finished=pb.Finished(modified=modified)
    )
    return pb.AgentMessage(seq=seq, update=update)


def logged(seq: int, alloc: str) -> pb.AgentMessage:
    update = pb.AllocationUpdate(allocation_id=alloc, attempt=1, log=pb.LogLine(line="hi"))
    return pb.AgentMessage(seq=seq, update=update)


def beat(seq: int) -> pb.AgentMessage:
    return pb.AgentMessage(seq=seq, heartbeat=pb.Heartbeat())


def shape(messages: list[pb.AgentMessage]) -> list[tuple[int, int | None]]:
    return [(m.seq, e.seq if e is not None else None) for m, e in paired(messages)]


@pytest.mark.parametrize(
    ("messages", "want"),
    [
        pytest.param([started(1, "a")], [(1, None)], id="a lone start"),
        pytest.param([started(1, "a"), finished(2, "a")], [(1, 2)], id="a start and its end"),
        pytest.param(
            [started(1, "a"), started(2, "b"), finished(3, "a"), beat(4), finished(5, "b")],
            [(1, 3), (2, 5), (4, None)],
            id="two allocations interleaved, a heartbeat between",
        ),
        pytest.param(
            [started(1, "a"), logged(2, "a"), finished(3, "a")],
            [(1, None), (2, None), (3, None)],
            id="a log of the same allocation between: kept in order, not paired",
        ),
        pytest.param(
            [started(1, "a", attempt=1), finished(2, "a", attempt=2)],
            [(1, None), (2, None)],
            id="another attempt's end",
        ),
        pytest.param(
            [started(1, "a"), finished(2, "a", steps="20")],
            [(1, None), (2, None)],
            id="an end that says the agent changed the request (its log line comes first)",
        ),
        pytest.param(
            [finished(1, "a"), started(2, "a")],
            [(1, None), (2, None)],
            id="an end before a start",
        ),
        pytest.param(
            [started(1, "a"), finished(2, "a"), started(3, "a"), finished(4, "a")],
            [(1, 2), (3, 4)],
            id="the same allocation twice (a resent pair): each pair on its own",
        ),
    ],
)
def test_pairs(messages: list[pb.AgentMessage], want: list[tuple[int, int | None]]) -> None:
    assert shape(messages) == want
