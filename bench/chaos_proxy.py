"""A tiny TCP proxy the chaos harness kills to cut agents' connections.

Usage: ``python bench/chaos_proxy.py LISTEN:TARGET [LISTEN:TARGET ...]`` (ports on
127.0.0.1). Each pair forwards bytes both ways. ``kill -9`` drops every
connection through it at once, as a flaky home router or a NAT that forgets
its table would; started again on the same ports, the agents' reconnects go
through. It imports nothing from corral, so it starts in a blink.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def forwarder(target: int) -> object:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return handle


async def main(pairs: list[str]) -> None:
    servers = []
    for pair in pairs:
        listen, target = (int(p) for p in pair.split(":"))
        server = await asyncio.start_server(
            forwarder(target), "127.0.0.1", listen, reuse_address=True
        )
        servers.append(server)
    print("proxy ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
