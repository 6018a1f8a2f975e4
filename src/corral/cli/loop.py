"""The event loop the long-running commands (server, agent, up) run on, and their heap.

uvloop where it is installed (it is a dependency on Linux and macOS): the
server's HTTP, SSE and gRPC traffic and the agent's link are many small
socket operations, and uvloop does each for a fraction of asyncio's CPU.
``CORRAL_EVENT_LOOP=asyncio`` runs on
asyncio's own loop instead, e.g. to rule uvloop out when chasing a bug.

``settle_heap()`` runs once a command has started: see its docstring.
``CORRAL_GC=default`` leaves Python's collector settings alone.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from corral.core.errors import InvalidSpec

T = TypeVar("T")

ENV = "CORRAL_EVENT_LOOP"
GC_ENV = "CORRAL_GC"
FIRST_GENERATION = 10_000
"""Allocations (net of frees) between young-generation collections; Python's default is 700."""


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


def settle_heap() -> bool:
    """Keep what startup built out of the cyclic collector's way; False when told not to.

    A started server holds hundreds of thousands of long-lived objects (modules,
    routes, pydantic and SQLAlchemy schemas, protobuf descriptors) that every
    full collection walked again: with Python's defaults the collector took
    about 120 us of each job's server CPU in the end-to-end benchmark, most of
    it in full collections. ``gc.freeze()`` moves everything alive now to a
    generation the collector never scans, and a young-generation threshold of
    ``FIRST_GENERATION`` collects about 30 times less often; together about
    20 us per job. Cycles are still
    collected, a little later; memory stays bounded.
    """
    if os.environ.get(GC_ENV, "").strip().lower() == "default":
        return False
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(FIRST_GENERATION, second, third)
    return True
