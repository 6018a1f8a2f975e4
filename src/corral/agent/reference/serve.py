"""Serve an ASGI app on a free loopback port inside the running event loop."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import uvicorn


@asynccontextmanager
async def serving(app: Any, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Run ``app`` until the block ends; yields its base URL (``http://127.0.0.1:PORT``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        ws="websockets-sansio",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # startup failed: raise its error
            await asyncio.sleep(0.005)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextmanager
def serving_in_thread(app: Any) -> Iterator[str]:
    """``serving`` from a thread of its own, for a caller that is not async (a test that
    runs agents as other processes); its URL."""
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def run() -> None:
        holder["loop"], holder["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with serving(app) as url:
            holder["url"] = url
            ready.set()
            await holder["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the reference backend did not start within 30 s")
    try:
        yield holder["url"]
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(30)


def free_port() -> int:
    """A loopback port nobody listens on (for 'backend down' tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
