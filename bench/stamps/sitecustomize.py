"""Step stamps for ``bench/e2e_steps.py``: imported by every Python process started with this
folder on ``PYTHONPATH`` (the server, the agents) when ``BENCH_STAMPS`` names a file prefix.

Each step below is wrapped as its module is imported; every call writes ``<time.time()>
<step>`` to ``<prefix>.<pid>`` (``>``/``<`` mark the start and end of a coroutine). Nothing
is wrapped, and nothing written, without the variable.

With ``BENCH_LOOP_TRACE`` set too, every callback an asyncio event loop runs writes
``<time.time()> loop <pid> <what> <ms it took>``: a task's step is named by its coroutine and
the innermost coroutine it then waits in. Only asyncio's own loop can be traced
(``CORRAL_EVENT_LOOP=asyncio``; uvloop runs its callbacks in C), and the tracing slows it.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

PREFIX = os.environ.get("BENCH_STAMPS")

# module -> (class or None for a module function, attribute, step name, is it a coroutine)
STEPS: dict[str, Sequence[tuple[str | None, str, str, bool]]] = {
    "corral.server.services.jobs": [("JobService", "submit", "server: submit", True)],
    "corral.server.services.group": [("GroupCommitter", "_commit", "server: group commit", True)],
    "corral.server.store.wal_sync": [
        ("WalSync", "_sync", "server: fsync", True),
        ("WalSync", "wait", "server: walwait", True),
    ],
    "corral.server.services.settling": [(None, "end_allocation", "server: end_allocation", True)],
    "corral.server.store.events": [(None, "append", "server: events append", True)],
    "corral.server.loops.schedule": [
        ("SchedulingLoop", "cycle", "server: cycle", True),
        ("SchedulingLoop", "_remember", "server: cycle remembers", False),
    ],
    "corral.server.loops.leader": [("AdvisoryLockLeader", "acquire", "server: leader check", True)],
    "corral.scheduler.incremental": [("Scheduler", "schedule", "server: schedule", False)],
    "corral.server.loops.changes": [("ChangeFeed", "read", "server: catch up", True)],
    "corral.agent.supervisor": [
        ("Supervisor", "assign", "agent: supervisor assign", False),
        ("Supervisor", "_run", "agent: slot run", True),
    ],
    "corral.server.services.placement": [(None, "apply_plan", "server: apply plan", True)],
    "corral.server.agentlink.grpc_link": [("GrpcLink", "assign", "server: assign sent", True)],
    "corral.server.agentlink.grpc_service": [
        ("AgentLinkService", "_handle", "server: agent update", True),
        ("AgentLinkService", "_ran", "server: agent start+end", True),
        (None, "paired", "server: agent message read", False),
    ],
    "corral.server.services.agents": [
        ("AgentService", "ran", "server: start+end unit", True),
        ("AgentService", "_fenced", "server: fenced", True),
    ],
    "corral.server.services.recent": [("RecentEvents", "add", "server: events published", False)],
    "corral.server.api.render": [(None, "event_json", "server: SSE event framed", False)],
    "corral.proto.bundles": [(None, "pack", "link: messages written", False)],
    "corral.agent.wire": [
        (None, "order_from", "agent: assignment read", False),
        (None, "update_message", "agent: update written", False),
    ],
}


def _wrap(fn: Callable[..., Any], step: str, is_async: bool, out: Any) -> Callable[..., Any]:
    if is_async:

        @functools.wraps(fn)
        async def timed(*args: Any, **kw: Any) -> Any:
            out.write(f"{time.time():.6f} {step} >\n")
            try:
                return await fn(*args, **kw)
            finally:
                out.write(f"{time.time():.6f} {step} <\n")

        return timed

    @functools.wraps(fn)
    def stamped(*args: Any, **kw: Any) -> Any:
        out.write(f"{time.time():.6f} {step}\n")
        return fn(*args, **kw)

    return stamped


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, out: Any) -> None:
        self.out = out

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in STEPS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            for owner_name, attr, step, is_async in STEPS[name]:
                owner = getattr(module, owner_name) if owner_name else module
                fn = getattr(owner, attr, None)
                if fn is not None:  # an older build may lack a step (A/B runs of two builds)
                    setattr(owner, attr, _wrap(fn, step, is_async, self.out))

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if PREFIX:
    sys.meta_path.insert(0, _Finder(open(f"{PREFIX}.{os.getpid()}", "a", buffering=1)))  # noqa: SIM115


def _callback_name(callback: Any) -> str:
    """A task step as ``task <coroutine> @<innermost coroutine it waits in>``; else the name."""
    owner = getattr(callback, "__self__", None)
    if owner is None or not hasattr(owner, "get_coro"):
        return getattr(callback, "__qualname__", None) or repr(callback)[:80]
    coro = inner = owner.get_coro()
    while hasattr(getattr(inner, "cr_await", None), "cr_frame"):
        inner = inner.cr_await
    return f"task {getattr(coro, '__qualname__', '?')} @{getattr(inner, '__qualname__', '?')}"


def _trace_loop(out: Any) -> None:
    import asyncio.events

    run = asyncio.events.Handle._run
    pid = os.getpid()

    def traced(self: Any) -> None:
        started = time.time()
        run(self)
        took = time.time() - started
        try:
            name = _callback_name(self._callback)
        except Exception as exc:  # a name is all this wants: never break the loop
            name = f"? {exc!r}"
        out.write(f"{started:.6f} loop {pid} {name} {1000 * took:.3f}\n")

    asyncio.events.Handle._run = traced  # type: ignore[method-assign]


if PREFIX and os.environ.get("BENCH_LOOP_TRACE"):
    _trace_loop(open(f"{PREFIX}.{os.getpid()}.loop", "a", buffering=1))  # noqa: SIM115
