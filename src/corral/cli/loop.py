"""The event loop the long-running commands (server, agent, up) run on.

uvloop where it is installed (it is a dependency on Linux and macOS): the
server's HTTP, SSE and gRPC traffic and the agent's link are many small
socket operations, and uvloop does each for a fraction of asyncio's CPU
(docs/performance.md, "Fourth round"). ``CORRAL_EVENT_LOOP=asyncio`` runs on
asyncio's own loop instead, e.g. to rule uvloop out when chasing a bug.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from corral.core.errors import InvalidSpec

T = TypeVar("T")

ENV = "CORRAL_EVENT_LOOP"


def choice() -> Literal["uvloop", "asyncio"]:
    """``uvloop`` unless ``CORRAL_EVENT_LOOP`` says ``asyncio`` or uvloop is not installed."""
    wanted = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if wanted not in ("auto", "uvloop", "asyncio"):
        raise InvalidSpec(ENV, f"must be auto, uvloop or asyncio, not {wanted!r}")
    if wanted == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if wanted == "uvloop":
            raise InvalidSpec(ENV, "is uvloop but uvloop is not installed") from None
        return "asyncio"
    return "uvloop"


def factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    if choice() == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    with asyncio.Runner(loop_factory=factory()) as runner:
        return runner.run(main)
