"""Python handlers used by the Python executor's tests (imported by 'module:function')."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from corral.agent.executors.base import Checkpoint, LogLine, Preview, Progress, Result
from corral.agent.executors.python import HandlerContext
from corral.agent.executors.scripted import tiny_png
from corral.core import ExecutorError

STEP_S = 0.01


def quick(ctx: HandlerContext) -> Iterator[object]:
    """Two steps with a preview, then a PNG result; fills in the default model."""
    if ctx.model is None:
        ctx.modified["model"] = "tiny-default"
    yield 0.5
    yield Preview(tiny_png(128), step=1)
    yield LogLine(f"working on {ctx.payload.get('prompt', '')}")
    yield Progress(1.0, 2, 2)
    return tiny_png(255)


def failing(ctx: HandlerContext) -> Iterator[object]:
    yield 0.1
    raise ValueError("the prompt is empty")


def long(ctx: HandlerContext) -> Iterator[object]:
    """Runs until stopped; checkpoints when preempted, keeps a partial result."""
    start = int(ctx.resume_from.rsplit("-", 1)[1]) if ctx.resume_from else 0
    for step in range(start, 100_000):
        if ctx.stopping == "preempt":
            yield Checkpoint(f"{ctx.checkpoint_dir}/ckpt-{step}", step)
        if ctx.stopping:
            return Result("partial.txt", f"stopped at {step}".encode(), "text/plain")
        time.sleep(STEP_S)
        yield (step + 1) / 100_000


def stubborn(ctx: HandlerContext) -> Iterator[object]:
    """Ignores stops: the executor must abandon it after the grace."""
    yield Result("early.txt", b"kept", "text/plain")
    while True:
        time.sleep(STEP_S)
        yield 0.5


async def async_generator(ctx: HandlerContext) -> AsyncIterator[object]:
    for step in range(1, 4):
        await asyncio.sleep(0)
        yield Progress(step / 3, step, 3)
    yield Result("out.txt", b"async generated", "text/plain")


async def async_function(ctx: HandlerContext) -> dict[str, bytes]:
    await asyncio.sleep(0)
    return {"a.txt": b"A", "b.bin": b"B"}


def writes_a_file(ctx: HandlerContext) -> list[Path]:
    assert ctx.checkpoint_dir is not None
    path = ctx.checkpoint_dir / "image.png"
    path.write_bytes(tiny_png(7))
    return [path]


def out_of_memory(ctx: HandlerContext) -> bytes:
    raise ExecutorError("CUDA out of memory", retryable=True)


def goes_backwards(ctx: HandlerContext) -> Iterator[object]:
    yield 0.6
    yield 0.2
    yield 7.0
    return b"x"


def yields_junk(ctx: HandlerContext) -> Iterator[object]:
    yield {"progress": 0.5}
    return b"never"


def returns_a_missing_file(ctx: HandlerContext) -> str:
    return "/nonexistent/corral/result.png"


def by_scenario(ctx: HandlerContext) -> Iterator[object]:
    """The conformance harness's handler: the payload's ``scenario`` picks the behaviour."""
    chosen = {"quick": quick, "failing": failing, "long": long}[ctx.payload["scenario"]]
    return (yield from chosen(ctx))
