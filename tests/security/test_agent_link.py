"""Attack: connections to the agent port that cost the server and never go away (issue 45,
item 6, the gRPC part).

A TCP connection that never speaks HTTP/2, a gRPC connection with no call open, a
stream that never says hello and a client that pings without pause each held a
descriptor and memory for as long as the client liked (the handshake limit was gRPC's
120 s, idle connections had none, and ping strikes were unlimited: the option that was
meant to set the ping interval had an outdated name). Now each is closed, while an
agent that heartbeats and pings at its pace stays connected.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from http_harness import ADMIN_TOKEN, eventually
from process_harness import ServerProcess

from corral.agent.link import LinkSettings
from corral.server.settings import AgentLinkSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from raw_agent import RawAgent

pytestmark = pytest.mark.anyio

MIN_PING_S = 1.5  # the server's agents.min_ping_interval_s here
PACED = [("grpc.keepalive_time_ms", 2000), ("grpc.keepalive_permit_without_calls", 1)]
FLOOD = [  # gRPC clients ping at most once a second: that is a strike each time here
    ("grpc.keepalive_time_ms", 100),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
STAY_S = 5.0  # the paced agent pings at 2 and 4 s; the flood strikes out at about 4 s
GRPC_SETTLE_S = 0.2  # see test_uploads._connected


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    env = {
        "CORRAL_ADMIN_TOKEN": ADMIN_TOKEN,
        "CORRAL_AGENTS__HELLO_TIMEOUT_S": "1",
        "CORRAL_AGENTS__IDLE_CONNECTION_S": "1",
        "CORRAL_AGENTS__MIN_PING_INTERVAL_S": str(MIN_PING_S),
    }
    process = ServerProcess(str(tmp_path / "corral.db"), tmp_path / "home", env=env).start()
    try:
        yield process
    finally:
        process.stop()


def test_an_agent_pings_no_faster_than_a_server_allows_by_default() -> None:
    """The defaults agree: the agent's keepalive is twice the interval the server allows."""
    assert LinkSettings(token="t").keepalive_s >= 2 * AgentLinkSettings().min_ping_interval_s


async def test_connections_that_never_say_hello_are_dropped(server: ServerProcess) -> None:
    address = _agents_address(server)
    host, port = address.removeprefix("grpc://").rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))  # not even HTTP/2
    silent.setblocking(False)
    idle = grpc.aio.insecure_channel(address.removeprefix("grpc://"))  # HTTP/2, no call
    mute = RawAgent(address, ADMIN_TOKEN)  # a stream that never says hello
    try:
        await idle.channel_ready()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await mute.knock()
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "must be a hello" in (caught.value.details() or "")
        await eventually(lambda: _closed(silent))
        await eventually(lambda: _left_ready(idle))
    finally:
        silent.close()
        await idle.close()
        await mute.close()
        await asyncio.sleep(GRPC_SETTLE_S)


async def test_a_ping_flood_is_cut_off_and_an_agent_at_its_pace_stays(
    server: ServerProcess,
) -> None:
    address = _agents_address(server)
    paced = RawAgent(address, ADMIN_TOKEN, node="paced", options=PACED)
    flood = RawAgent(address, ADMIN_TOKEN, node="flood", options=FLOOD)
    try:
        await paced.connect()
        await flood.connect()
        # Neither writes meanwhile (a write puts a client's keepalive ping off): only pings.
        deadline = asyncio.get_running_loop().time() + STAY_S
        ended = await _ends_within(flood, STAY_S)
        assert ended is not None, "the flood was never cut off"
        assert ended[0] is grpc.StatusCode.UNAVAILABLE
        assert "many pings" in ended[1]
        left = deadline - asyncio.get_running_loop().time()
        assert await _ends_within(paced, left) is None, "the agent at its pace stays"
        await paced.beat()
    finally:
        await paced.close()
        await flood.close()
        await asyncio.sleep(GRPC_SETTLE_S)


async def _ends_within(agent: RawAgent, seconds: float) -> tuple[grpc.StatusCode, str] | None:
    """How ``agent``'s stream ended (status, details), waiting ``seconds`` at most; None
    when it is still open then."""
    try:
        async with asyncio.timeout(max(0.0, seconds)):
            code = await agent.call.code()
    except TimeoutError:
        return None
    return code, await agent.call.details() or ""


def _agents_address(server: ServerProcess) -> str:
    found = re.search(r"--server (grpc://\S+)", "\n".join(server.output))
    assert found is not None, server.output
    return found.group(1)


async def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def _left_ready(channel: grpc.aio.Channel) -> bool:
    return channel.get_state() is not grpc.ChannelConnectivity.READY
