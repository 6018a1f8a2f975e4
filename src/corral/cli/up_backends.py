"""``corral up --demo``: the reference AUTOMATIC1111 and ComfyUI backends, for machines
without a GPU.

Each runs as its own process (``python -m corral.agent.reference``): the webui
one generates real images with a tiny random diffusers pipeline on CPU, so an
existing A1111 or ComfyUI client pointed at corral gets a picture back with no
GPU and nothing downloaded. The webui needs the ``demo`` extra (torch,
diffusers); without it ``corral up`` says so in one line, with the command that adds
it, and goes on without that API.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

START_TIMEOUT_S = 120.0
"""Importing torch and diffusers on a slow machine takes a while."""
_LISTENING = re.compile(r"listening on (http://\S+)")
_MISSING = re.compile(r"No module named '([\w.]+)'")
INSTALL_DEMO = "python3 -m pip install -e '.[demo]'"  # as the README installs: from a checkout
_SERVES = {"a1111": "the AUTOMATIC1111 API (/sdapi/v1)", "comfyui": "the ComfyUI API (/prompt)"}


@dataclass(frozen=True, slots=True)
class DemoBackends:
    a1111: str | None = None  # the backends' URLs (loopback)
    comfyui: str | None = None


@contextlib.asynccontextmanager
async def demo_backends(enabled: bool) -> AsyncIterator[DemoBackends]:
    """Start both reference backends (when ``enabled``); stop them when the block ends."""
    if not enabled:
        yield DemoBackends()
        return
    procs: list[asyncio.subprocess.Process] = []
    drains: list[asyncio.Task[None]] = []
    try:
        a1111, comfyui = await asyncio.gather(
            _start("a1111", procs, drains), _start("comfyui", procs, drains)
        )
        yield DemoBackends(a1111, comfyui)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)
        for task in drains:
            task.cancel()


async def _start(
    backend: str, procs: list[asyncio.subprocess.Process], drains: list[asyncio.Task[None]]
) -> str | None:
    """One reference backend's URL, or None (with the reason printed) if it did not start."""
    extra = ("--step-delay", "0.05") if backend == "comfyui" else ()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "corral.agent.reference", backend, "--port", "0", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    procs.append(proc)
    assert proc.stdout is not None
    tail: list[str] = []
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while line := (await proc.stdout.readline()).decode(errors="replace"):
                if match := _LISTENING.search(line):
                    drains.append(asyncio.create_task(_drain(proc.stdout)))
                    return match.group(1)
                tail = [*tail[-4:], line.rstrip()]
    except TimeoutError:
        tail.append(f"(no answer within {START_TIMEOUT_S:g}s)")
    print(not_serving(backend, tail), flush=True)
    return None


def not_serving(backend: str, tail: list[str]) -> str:
    """One line: the API ``corral up`` goes on without, why, and the command that adds it
    (a missing module), from the last lines the backend printed; never its traceback."""
    missing = next((m.group(1) for t in tail if (m := _MISSING.search(t))), None)
    if missing is not None:
        why = f"needs {missing.split('.')[0]}; add it with: {INSTALL_DEMO}"
    else:
        why = f"its reference backend did not start ({tail[-1].strip() if tail else 'no output'})"
    return f"corral: not serving {_SERVES.get(backend, backend)}: {why}"


async def _drain(stream: asyncio.StreamReader) -> None:
    """Keep reading the backend's output so its pipe never fills up."""
    while await stream.readline():
        pass
