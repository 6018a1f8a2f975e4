"""Slow and greedy HTTP clients against a real ``corral server`` (issue 45, item 6).

Raw sockets on loopback, no token: clients that send their headers or their
body a byte at a time are cut off (408) once their deadline passes, however
they trickle, while a normal client is served meanwhile; headers past the size
limit get 431; connections past the limit, or past one address's limit, get
503 at once. The deadlines are
set small here (the defaults are 10 s and 30 s, docs/security/http.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from process_harness import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DEADLINE_S = 1.0
SLOW_CLIENTS = 60  # of each kind: bounded, loopback only (bench/abuse.py runs the full size)
GIVE_UP_S = 15.0  # generous: a slow machine must not fail this, a missing timeout must
TRICKLE_EVERY_S = 0.2


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    env = {
        "CORRAL_API__HEADER_TIMEOUT_S": str(DEADLINE_S),
        "CORRAL_API__BODY_TIMEOUT_S": str(DEADLINE_S),
        "CORRAL_API__MAX_CONNECTIONS": "400",
    }
    proc = ServerProcess(str(tmp_path / "corral.db"), tmp_path, env=env).start()
    try:
        yield proc
    finally:
        proc.stop()


async def test_slow_headers_and_bodies_are_cut_off_while_a_normal_client_is_served(
    server: ServerProcess,
) -> None:
    host, port = _address(server)
    body_head = "POST /v1/jobs/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    kinds = {
        "slow header": "GET /v1/queue HTTP/1.1\r\nHost: x\r\nX-Slow: ",
        "stalled body": body_head + "Content-Length: 100000\r\n\r\n",
        "trickled body": body_head + "Content-Length: 100000\r\n\r\n{",
        "answered, then trickled": "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n"
        "{",
        "authenticated, trickled": (  # read by the endpoint itself, after the token is checked
            f"POST /prompt HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.admin_token}\r\n"
            "Content-Length: 100000\r\n\r\n{"
        ),
    }
    async with _clients(host, port, kinds) as clients:
        trickling = asyncio.create_task(_trickle(clients))
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as normal:
            assert (await normal.get("/healthz")).status_code == 200
            started = time.monotonic()
            answers = await asyncio.gather(*(_until_closed(r) for _, r, _ in clients))
            assert time.monotonic() - started < GIVE_UP_S
            assert (await normal.get("/healthz")).status_code == 200
        trickling.cancel()
    server.stop()
    assert "Traceback" not in _logged(server)  # a client cut off is no server error
    for (kind, _, _), answer in zip(clients, answers, strict=True):
        want = b"401" if kind.startswith("answered") else b"408"
        assert answer.split(b"\r\n", 1)[0].endswith(_reason(want)), (kind, answer[:200])
        if want == b"408":
            assert (
                b"api.header_timeout_s" in answer
                or b"api.body_timeout_s" in answer
                or (b"api.min_body_bytes_per_s" in answer)
            ), answer


async def test_headers_past_the_size_limit_get_431(server: ServerProcess) -> None:
    host, port = _address(server)
    reader, writer = await asyncio.open_connection(host, port)
    huge = "GET /v1/queue HTTP/1.1\r\nHost: x\r\n" + "X-Big: " + "a" * 70_000 + "\r\n\r\n"
    writer.write(huge.encode())
    answer = await _until_closed(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b"api.max_header_bytes" in answer


async def test_connections_past_the_limit_are_refused_at_once(tmp_path: Path) -> None:
    env = {"CORRAL_API__MAX_CONNECTIONS": "20", "CORRAL_API__HEADER_TIMEOUT_S": "60"}
    proc = ServerProcess(str(tmp_path / "corral.db"), tmp_path, env=env).start()
    try:
        host, port = _address(proc)
        held = [await asyncio.open_connection(host, port) for _ in range(20)]
        await asyncio.sleep(0.2)  # the server has accepted them all
        reader, writer = await asyncio.open_connection(host, port)
        answer = await _until_closed(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"api.max_connections" in answer
        for _, w in held:
            w.close()
        await _eventually_served(proc.url)
    finally:
        proc.stop()


async def test_one_address_cannot_take_every_connection(tmp_path: Path) -> None:
    """An attacker's machine (127.0.0.2 here) holds its limit; the next of its connections
    is refused at once, while other clients (127.0.0.1: a trusted proxy's address by
    default, as a reverse proxy on the same host would be) are still served."""
    env = {"CORRAL_API__MAX_CONNECTIONS_PER_ADDRESS": "10", "CORRAL_API__HEADER_TIMEOUT_S": "60"}
    proc = ServerProcess(str(tmp_path / "corral.db"), tmp_path, env=env).start()
    try:
        host, port = _address(proc)
        attacker = ("127.0.0.2", 0)
        held = [await asyncio.open_connection(host, port, local_addr=attacker) for _ in range(10)]
        await asyncio.sleep(0.2)  # the server has accepted them all
        reader, writer = await asyncio.open_connection(host, port, local_addr=attacker)
        answer = await _until_closed(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"api.max_connections_per_address" in answer
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
            assert (await client.get("/healthz")).status_code == 200
        for _, w in held:
            w.close()
    finally:
        proc.stop()


# ---- helpers --------------------------------------------------------------------------------

Client = tuple[str, asyncio.StreamReader, asyncio.StreamWriter]


def _address(proc: ServerProcess) -> tuple[str, int]:
    host, port = proc.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


@contextlib.asynccontextmanager
async def _clients(host: str, port: int, kinds: dict[str, str]) -> AsyncIterator[list[Client]]:
    """``SLOW_CLIENTS`` connections of each kind, each having sent its opening."""
    clients: list[Client] = []
    try:
        for kind, opening in kinds.items():
            for _ in range(SLOW_CLIENTS):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(opening.encode())
                clients.append((kind, reader, writer))
        yield clients
    finally:
        for _, _, writer in clients:
            writer.close()


async def _trickle(clients: list[Client]) -> None:
    """One more byte from every client that trickles, every ``TRICKLE_EVERY_S``."""
    while True:
        await asyncio.sleep(TRICKLE_EVERY_S)
        for kind, _, writer in clients:
            if kind != "stalled body" and not writer.is_closing():
                with contextlib.suppress(OSError):
                    writer.write(b"a")


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    received = b""
    deadline = time.monotonic() + GIVE_UP_S
    with contextlib.suppress(ConnectionResetError):
        while chunk := await asyncio.wait_for(reader.read(65536), deadline - time.monotonic()):
            received += chunk
    return received


async def _eventually_served(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        deadline = time.monotonic() + GIVE_UP_S
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/healthz")).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError("a normal client was not served once the held connections closed")


def _logged(proc: ServerProcess) -> str:
    """Everything the (stopped) server printed."""
    lines = list(proc.output)
    while not proc.lines.empty():
        lines.append(proc.lines.get_nowait())
    return "\n".join(lines)


def _reason(status: bytes) -> bytes:
    return {b"401": b"401 Unauthorized", b"408": b"408 Request Timeout"}[status]
