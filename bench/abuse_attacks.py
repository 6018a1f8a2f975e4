"""The resource attacks ``bench/abuse.py`` runs against a real server, one coroutine each.

Every attack is bounded: a count of requests or connections scaled from the
size issue 45 reported, and the phase's deadline. Each returns how the server
answered (status code or gRPC status name -> count), so the report shows what
was refused and how.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import httpx

from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.proto.gen.corral.v1 import agent_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Target:
    """Where the attacks aim and the leaked tokens they hold."""

    url: str
    agent_address: str  # host:port of the gRPC agent link
    team_token: str  # a leaked team token
    agent_token: str  # a leaked agent join token


Attack = Callable[[Target, int, float], Awaitable[Counter[str]]]

ATTACKER = "127.0.0.2"
"""The attacker's own address (loopback still): the well-behaved clients come from
127.0.0.1, as they would from other machines, so per-address limits can tell them apart."""


async def uploads(target: Target, count: int, deadline: float) -> Counter[str]:
    """Item 1: ``count`` unfinished uploads, each for an invented allocation id."""
    outcome: Counter[str] = Counter()
    metadata = (("authorization", f"Bearer {target.agent_token}"),)
    # Each channel its own connection, four calls on each (the server caps streams per
    # connection): the attack is the uploads, not the multiplexing.
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(target.agent_address, options) for _ in range(8)]
    todo = iter(range(count))

    async def worker(channel: grpc.aio.Channel) -> None:
        stub = pb_grpc.AgentLinkStub(channel)
        for i in todo:
            if time.monotonic() > deadline:
                return
            chunk = pb.BlobChunk(
                allocation_id=f"alloc_{secrets.token_hex(6)}",
                attempt=1,
                name=f"part-{i}",
                offset=0,
                data=b"x" * 64,
            )
            try:
                await stub.UploadBlob(iter([chunk]), metadata=metadata, timeout=10)
                outcome["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                outcome[exc.code().name] += 1

    try:
        await asyncio.gather(*(worker(channels[i % len(channels)]) for i in range(32)))
    finally:
        for channel in channels:
            await channel.close()
    return outcome


async def options(target: Target, count: int, deadline: float) -> Counter[str]:
    """Item 3: ``count`` posts of 3.5 MB A1111 options, each as a different caller would."""
    outcome: Counter[str] = Counter()
    big = {f"custom_{k}": "v" * 35_000 for k in range(100)}  # about 3.5 MB of JSON
    body = json.dumps(big).encode()
    headers = {"Content-Type": "application/json"}
    transport = httpx.AsyncHTTPTransport(local_address=ATTACKER)
    async with httpx.AsyncClient(base_url=target.url, transport=transport, timeout=30) as client:
        for i in range(count):
            if time.monotonic() > deadline:
                break
            auth = (f"caller{i}", target.team_token)
            try:
                r = await client.post("/sdapi/v1/options", content=body, headers=headers, auth=auth)
                outcome[str(r.status_code)] += 1
            except httpx.HTTPError as exc:
                outcome[type(exc).__name__] += 1
    return outcome


async def sse(target: Target, count: int, deadline: float) -> Counter[str]:
    """Item 4: ``count`` event streams asking to replay all history, held to the deadline."""
    outcome: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    transport = httpx.AsyncHTTPTransport(local_address=ATTACKER, limits=limits)
    headers = {"Authorization": f"Bearer {target.team_token}"}
    async with httpx.AsyncClient(
        base_url=target.url, headers=headers, transport=transport, timeout=30
    ) as client:

        async def one() -> None:
            try:
                async with client.stream("GET", "/v1/events", params={"after": 0}) as r:
                    outcome[str(r.status_code)] += 1
                    async for _ in r.aiter_lines():
                        if time.monotonic() > deadline:
                            return
            except httpx.HTTPError as exc:
                outcome[type(exc).__name__] += 1

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await asyncio.gather(*(one() for _ in range(count)))
    return outcome


async def flood(target: Target, count: int, deadline: float) -> Counter[str]:
    """Item 5: one team token submitting ``count`` jobs as fast as it can (batches of 100)."""
    outcome: Counter[str] = Counter()
    headers = {"Authorization": f"Bearer {target.team_token}"}
    batches = iter(range(0, count, 100))
    transport = httpx.AsyncHTTPTransport(local_address=ATTACKER)
    async with httpx.AsyncClient(
        base_url=target.url, headers=headers, transport=transport, timeout=30
    ) as client:

        async def worker() -> None:
            for first in batches:
                if time.monotonic() > deadline:
                    return
                jobs = [{"kind": "sample", "payload": {"i": first + k}} for k in range(100)]
                try:
                    r = await client.post("/v1/jobs/batch", json={"jobs": jobs})
                    outcome[str(r.status_code)] += 1
                except httpx.HTTPError as exc:
                    outcome[type(exc).__name__] += 1

        await asyncio.gather(*(worker() for _ in range(8)))
    return outcome


async def slow(target: Target, count: int, deadline: float) -> Counter[str]:
    """Item 6: ``count`` slow-header and ``count`` slow-body connections with no token,
    each dribbling a byte a second; counts how many the server closed before the deadline."""
    host, port = httpx.URL(target.url).host, httpx.URL(target.url).port or 80
    outcome: Counter[str] = Counter()
    heads = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    bodies = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"

    async def one(start: bytes, label: str) -> None:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(ATTACKER, 0))
        except OSError as exc:
            outcome[f"{label} refused ({type(exc).__name__})"] += 1
            return
        try:
            writer.write(start)
            while time.monotonic() < deadline:
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        if await reader.read(1024) == b"":
                            outcome[f"{label} closed by server"] += 1
                            return
                writer.write(b"X" if label == "slow header" else b" ")
            outcome[f"{label} still open"] += 1
        except OSError:
            outcome[f"{label} closed by server"] += 1
        finally:
            writer.close()

    tasks = [one(heads, "slow header") for _ in range(count)]
    tasks += [one(bodies, "slow body") for _ in range(count)]
    await asyncio.gather(*tasks)
    return outcome


ATTACKS: dict[str, tuple[Attack, int]] = {
    # name: (attack, the count issue 45 reported at full size)
    "uploads": (uploads, 20_000),
    "options": (options, 180),
    "sse": (sse, 500),
    "flood": (flood, 22_000),
    "slow": (slow, 1_000),
}
