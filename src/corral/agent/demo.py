"""The demo executor: a CPU-only "image generator" for ``corral up`` and machines without GPUs.

It does what a diffusion backend looks like from outside, without one: it
starts from noise and "denoises" towards a picture drawn from the prompt
(a seeded gradient with a few discs), reporting progress every step and a
preview PNG every few steps, and returns the final PNG. It obeys stops as
every executor must (an interrupt returns the picture so far, a preempt
writes a checkpoint and fails retryably, a cancel or timeout fails) and
resumes from a checkpoint's step. PNGs are written with ``zlib`` only, so it
needs no imaging library.

Payload fields (all optional): ``prompt`` (str), ``steps`` (1..500, default
20), ``step_s`` (seconds per step, 0..60, default 0.1), ``size`` (pixels,
8..256, default 64), ``seed`` (int; drawn from the prompt when absent and
reported back as a request change), ``preview_every`` (steps, default 5).
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.agent.executors.base import (
    Checkpoint,
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
from corral.core.states import StopReason

DEFAULT_MODEL = "demo-tiny"


@dataclass(frozen=True, slots=True)
class DemoRequest:
    prompt: str = "a corral at dusk"
    steps: int = 20
    step_s: float = 0.1
    size: int = 64
    seed: int | None = None
    preview_every: int = 5

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> DemoRequest:
        """Read and check the payload; a bad field raises ``InvalidSpec`` naming it."""
        d = cls()
        req = cls(
            prompt=_typed(payload, "prompt", str, d.prompt),
            steps=_typed(payload, "steps", int, d.steps),
            step_s=float(_typed(payload, "step_s", (int, float), d.step_s)),
            size=_typed(payload, "size", int, d.size),
            seed=_typed(payload, "seed", (int, type(None)), None),
            preview_every=_typed(payload, "preview_every", int, d.preview_every),
        )
        for name, value, low, high in (
            ("steps", req.steps, 1, 500),
            ("step_s", req.step_s, 0, 60),
            ("size", req.size, 8, 256),
            ("preview_every", req.preview_every, 0, 500),
        ):
            if not low <= value <= high:
                raise InvalidSpec(f"payload.{name}", f"must be within {low}..{high}, got {value}")
        return req


def _typed(payload: Mapping[str, Any], key: str, kind: Any, default: Any) -> Any:
    value = payload.get(key, default)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InvalidSpec(f"payload.{key}", f"has the wrong type: {value!r}")
    return value


class DemoExecutor:
    """Paints seeded pictures on the CPU, step by step, on ``clock``."""

    def __init__(self, clock: Clock, name: str = "demo") -> None:
        self._clock = clock
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    async def run(self, assignment: JobWork, stop: StopSignal) -> AsyncIterator[Update]:
        req = DemoRequest.from_payload(assignment.payload)
        seed = req.seed if req.seed is not None else _seed_of(req.prompt)
        modified = {} if req.seed is not None else {"seed": str(seed)}
        if not assignment.model:
            modified["model"] = DEFAULT_MODEL
        canvas = Canvas(req.size, seed)
        step = min(assignment.resume_step, req.steps) if assignment.resume_from else 0
        if step:
            yield LogLine(f"resuming from {assignment.resume_from} at step {step}", "agent")
        while step < req.steps:
            if await first_of(self._clock.sleep(req.step_s), stop.wait()) == 1:
                break
            step += 1
            yield Progress(step / req.steps, step, req.steps)
            if req.preview_every and step % req.preview_every == 0 and step < req.steps:
                yield Preview(canvas.png(step / req.steps), step=step)
        request = stop.requested
        image = Result("image.png", canvas.png(step / req.steps), "image/png")
        if request is None:
            yield Finished((image,), modified)
            return
        if request.reason is StopReason.PREEMPT and step > 0:
            yield Checkpoint(_write_checkpoint(assignment, step), step, step / req.steps)
        yield stopped_terminal(request, (image,), modified)


def _seed_of(prompt: str) -> int:
    return int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")


def _write_checkpoint(assignment: JobWork, step: int) -> str:
    """A tiny checkpoint file (the step) in the job's checkpoint directory, if it has one."""
    name = f"{assignment.job_id}-step{step}.json"
    if assignment.checkpoint_dir is None:
        return name
    path = Path(assignment.checkpoint_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"step": step}))
    return str(path)


class Canvas:
    """A seeded picture and its noise; ``png(t)`` blends noise (t=0) into the picture (t=1)."""

    def __init__(self, size: int, seed: int) -> None:
        rng = random.Random(seed)
        self.size = size
        self._noise = bytes(rng.randrange(256) for _ in range(size * size * 3))
        self._picture = _picture(size, rng)

    def png(self, t: float) -> bytes:
        t = min(1.0, max(0.0, t))
        mixed = bytes(int(n + (p - n) * t) for n, p in zip(self._noise, self._picture, strict=True))
        return encode_png(self.size, self.size, mixed)


def _picture(size: int, rng: random.Random) -> bytes:
    top = [rng.randrange(256) for _ in range(3)]
    bottom = [rng.randrange(256) for _ in range(3)]
    discs = [
        (rng.uniform(0, size), rng.uniform(0, size), rng.uniform(size / 10, size / 4))
        for _ in range(3)
    ]
    colours = [[rng.randrange(256) for _ in range(3)] for _ in discs]
    out = bytearray()
    for y in range(size):
        row = [int(a + (b - a) * y / max(1, size - 1)) for a, b in zip(top, bottom, strict=True)]
        for x in range(size):
            pixel = row
            for (cx, cy, r), colour in zip(discs, colours, strict=True):
                if (x - cx) ** 2 + (y - cy) ** 2 <= r * r:
                    pixel = colour
            out += bytes(pixel)
    return bytes(out)


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG of ``rgb`` (``width * height * 3`` bytes, rows top to bottom)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    stride = width * 3
    rows = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 6))
        + chunk(b"IEND", b"")
    )
