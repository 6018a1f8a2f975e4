"""The scripted executor: a stub that acts out a job on an injected clock.

Tests and the simulator use it where a real backend would be: it takes
``steps`` steps of ``step_s`` seconds (on the clock it is given, so a virtual
clock makes hours pass instantly), reports progress, tiny preview images, log
lines and checkpoints, fails when told to, resumes from a checkpoint's step,
and obeys stops exactly like the real executors (the same conformance suite
checks it). A job's payload may override any field of the executor's default
``Script``, e.g. ``{"steps": 100, "step_s": 36, "fail_at": 50}``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from corral.agent.executors.base import (
    Checkpoint,
    Failed,
    Finished,
    JobWork,
    LogLine,
    Preview,
    Progress,
    Result,
    StopSignal,
    Update,
    stopped_terminal,
)
from corral.agent.executors.runner import first_of
from corral.core import Clock, InvalidSpec


@dataclass(frozen=True, slots=True)
class Script:
    """How a scripted job behaves. Every field may be overridden by the payload."""

    steps: int = 4
    step_s: float = 1.0
    fail_at: int | None = None  # fail when this step is reached
    error: str = "scripted failure"
    retryable: bool = False
    preview_every: int = 1  # 0: no previews
    checkpoint_every: int = 0  # 0: checkpoints only when preempted
    log_every: int = 0  # 0: no log lines
    default_model: str = "scripted-model"  # filled in when the job names none

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise InvalidSpec("payload.steps", f"must be >= 1, got {self.steps}")
        if self.step_s < 0:
            raise InvalidSpec("payload.step_s", f"must be >= 0, got {self.step_s}")
        for name in ("preview_every", "checkpoint_every", "log_every"):
            if getattr(self, name) < 0:
                raise InvalidSpec(f"payload.{name}", "must be >= 0")

    def overridden_by(self, payload: Mapping[str, Any]) -> Script:
        """This script with the payload's fields of the same names applied."""
        changes = {k: v for k, v in payload.items() if k in _FIELD_TYPES}
        for key, value in changes.items():
            want = _FIELD_TYPES[key]
            if (isinstance(value, bool) and bool not in want) or not isinstance(value, want):
                names = " or ".join(t.__name__ for t in want)
                raise InvalidSpec(f"payload.{key}", f"must be {names}, got {value!r}")
        return replace(self, **changes)


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "steps": (int,),
    "step_s": (int, float),
    "fail_at": (int, type(None)),
    "error": (str,),
    "retryable": (bool,),
    "preview_every": (int,),
    "checkpoint_every": (int,),
    "log_every": (int,),
    "default_model": (str,),
}


class ScriptedExecutor:
    """Acts out ``Script``s on ``clock``."""

    def __init__(self, clock: Clock, script: Script | None = None, name: str = "scripted") -> None:
        self._clock = clock
        self._script = script or Script()
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    async def run(self, assignment: JobWork, stop: StopSignal) -> AsyncIterator[Update]:
        script = self._script.overridden_by(assignment.payload)
        model = assignment.model or script.default_model
        modified = {} if assignment.model else {"model": model}
        start = min(assignment.resume_step, script.steps) if assignment.resume_from else 0
        if start:
            yield LogLine(f"resuming from {assignment.resume_from} at step {start}", "agent")
        step = start
        while step < script.steps:
            if await first_of(self._clock.sleep(script.step_s), stop.wait()) == 1:
                break
            step += 1
            if script.fail_at is not None and step >= script.fail_at:
                yield Failed(f"{script.error} at step {step}", retryable=script.retryable)
                return
            for update in _step_updates(script, assignment, step):
                yield update
        request = stop.requested
        if request is None:
            data = f"{assignment.job_id}: {model} steps {start}..{step}".encode()
            yield Finished((Result("result.txt", data, "text/plain"),), modified)
            return
        if request.reason == "preempt" and step > start:
            yield Checkpoint(_checkpoint_path(assignment, step), step, step / script.steps)
        partial = f"{assignment.job_id}: partial {step}/{script.steps}".encode()
        yield stopped_terminal(request, (Result("partial.txt", partial, "text/plain"),), modified)


def _step_updates(script: Script, assignment: JobWork, step: int) -> list[Update]:
    """What one finished step reports, in order."""
    updates: list[Update] = [Progress(step / script.steps, step, script.steps)]
    if script.preview_every and step % script.preview_every == 0:
        updates.append(Preview(tiny_png(step * 255 // script.steps), step=step))
    if script.log_every and step % script.log_every == 0:
        updates.append(LogLine(f"step {step}/{script.steps}"))
    if script.checkpoint_every and step % script.checkpoint_every == 0:
        path = _checkpoint_path(assignment, step)
        updates.append(Checkpoint(path, step, step / script.steps))
    return updates


def _checkpoint_path(assignment: JobWork, step: int) -> str:
    base = str(assignment.checkpoint_dir) if assignment.checkpoint_dir else "checkpoints"
    return f"{base}/{assignment.job_id}-step{step}.ckpt"


def tiny_png(shade: int, size: int = 8) -> bytes:
    """A valid ``size``x``size`` grey PNG, without an imaging library."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", size, size, 8, 0, 0, 0, 0)  # 8-bit greyscale
    rows = b"".join(b"\x00" + bytes([shade & 0xFF]) * size for _ in range(size))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
