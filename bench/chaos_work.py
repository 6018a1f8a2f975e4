"""The chaos harness's work: a Python handler that counts steps, checkpoints and resumes.

Agents run it with ``corral agent --handler chaos_work:run`` (``bench/`` on
``PYTHONPATH``). A job's payload says ``key`` (the client's name for it),
``steps``, ``step_s`` (seconds per step) and ``checkpoint_every`` (0: never;
then it also does not checkpoint when preempted). It

* resumes from ``ctx.resume_from`` (a checkpoint file an earlier attempt
  wrote, maybe on another machine: the agent fetched it) at the step inside;
* checkpoints every ``checkpoint_every`` steps, and at once when told to stop
  for a preemption (``ctx.checkpoint_now``);
* appends one line per step it executes (``key attempt step``) to the file
  named by ``$CHAOS_LEDGER``, so the harness can count work done twice. The
  line is written before the step is reported: a ``kill -9`` loses no line;
* returns ``result.json`` with the key, the attempt and the step it resumed from.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from corral.agent.executors.base import Checkpoint, LogLine
from corral.agent.executors.python import HandlerContext


def run(ctx: HandlerContext) -> Iterator[Any]:
    p = ctx.payload
    key, steps = str(p["key"]), int(p.get("steps", 5))
    step_s, every = float(p.get("step_s", 0.05)), int(p.get("checkpoint_every", 0))
    start = resume_step(ctx, key)
    if start:
        yield LogLine(f"resuming {key} at step {start} from {ctx.resume_from}", "agent")
    step = start
    while step < steps:
        if ctx.stopping is not None:
            if ctx.checkpoint_now and every and step > start:
                yield Checkpoint(save(ctx, key, step), step, step / steps)
            return None
        time.sleep(step_s)
        step += 1
        note(key, ctx.attempt, step)
        yield step / steps
        if every and step % every == 0 and step < steps:
            yield Checkpoint(save(ctx, key, step), step, step / steps)
    body = {"key": key, "attempt": ctx.attempt, "resumed_from": start, "steps": steps}
    return {"result.json": json.dumps(body).encode()}


def resume_step(ctx: HandlerContext, key: str) -> int:
    """The step in the checkpoint handed to this attempt (0 on a first attempt)."""
    if not ctx.resume_from:
        return 0
    saved = json.loads(Path(ctx.resume_from).read_text())
    if saved.get("key") != key:
        raise ValueError(f"checkpoint {ctx.resume_from} is not {key}'s")
    return int(saved["step"])


def save(ctx: HandlerContext, key: str, step: int) -> str:
    """Write the checkpoint file atomically: a crash never leaves half a file, and a
    zombie attempt still writing into the same directory never collides with this one."""
    folder = ctx.checkpoint_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    path = Path(folder) / f"{key}-step{step}.json"
    tmp = path.with_suffix(f".{ctx.attempt}.tmp")
    tmp.write_text(json.dumps({"key": key, "step": step}))
    tmp.replace(path)
    return str(path)


def note(key: str, attempt: int, step: int) -> None:
    """One ledger line per executed step (O_APPEND: lines from threads never interleave)."""
    ledger = os.environ.get("CHAOS_LEDGER")
    if not ledger:
        return
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key} {attempt} {step}\n".encode())
    finally:
        os.close(fd)
