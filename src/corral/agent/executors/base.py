"""The executor seam: one assignment in, a stream of updates out.

An executor runs one allocation's work on this node (an HTTP backend, a
Python handler, a subprocess, or the scripted stub) and reports what happens
as a stream of small frozen updates. The contract every executor keeps, and
that ``corral.agent.testing`` checks for each of them:

* it yields any number of ``Progress``, ``Preview``, ``LogLine`` and
  ``Checkpoint`` updates, then exactly one terminal update (``Finished`` or
  ``Failed``) as its last;
* it watches its ``StopSignal`` and ends soon after a stop is requested, within
  the stop's grace period: an *interrupt* finishes with the partial results
  produced so far (``Finished.interrupted``), a *preempt* reports a checkpoint
  if it can and fails retryably, a *cancel* or *timeout* fails for good;
* it reports what it changed in the request (a default model it filled in, a
  random seed it drew) in ``Finished.modified`` so the server knows what ran.

The updates mirror ``AllocationUpdate`` in ``proto/corral/v1/agent.proto``; the
link translates them one to one and adds the allocation id and attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from corral.core.model import EMPTY, frozen_map
from corral.core.states import StopReason


@dataclass(frozen=True, slots=True)
class Gang:
    """This replica's place in a gang (docs/agent.md "Gangs"): one rank per replica, all
    meeting at replica 0's node (``master_addr:master_port``)."""

    rank: int
    size: int
    master_addr: str
    master_port: int


@dataclass(frozen=True, slots=True)
class InputPath:
    """An uploaded file the job reads: the name its payload uses, its content, and where the
    agent put it (None until fetched)."""

    name: str
    sha256: str
    path: Path | None = None


@dataclass(frozen=True, slots=True)
class JobWork:
    """One job of an assignment, as an executor runs it: one attempt of the job, with this
    node's paths for it (the agent's side of ``Work`` in ``proto/corral/v1/agent.proto``)."""

    allocation_id: str
    attempt: int
    job_ids: tuple[str, ...]
    kind: str = "custom"
    payload: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    model: str | None = None  # None: the backend's current/default model
    model_path: Path | None = None  # the model's file from the agent's cache (registered models)
    gpu_indices: tuple[int, ...] = ()
    checkpoint_dir: Path | None = None
    resume_from: str | None = None  # a checkpoint reported by an earlier attempt
    resume_step: int = 0
    timeout_s: float | None = None
    # Where the agent keeps result files until the server has the allocation's end
    # (``scratch_dir``); None: an executor reads its result files instead.
    results_root: Path | None = None
    inputs: tuple[InputPath, ...] = ()  # uploaded files, fetched before the executor starts
    gang: Gang | None = None  # set for a replica of a gang
    memory_bytes: int = 0  # host memory its allocation holds (told to the job, not enforced)

    def __post_init__(self) -> None:
        object.__setattr__(self, "payload", frozen_map(self.payload))

    @property
    def job_id(self) -> str:
        """The (first) job this allocation runs."""
        return self.job_ids[0] if self.job_ids else self.allocation_id

    @property
    def scratch_dir(self) -> Path | None:
        """The folder the agent keeps until the server has the allocation's end: an executor
        may leave the files its results name there (``Result.path``) instead of reading them
        (``<results_root>/<allocation>/<job>``, named here, made by whoever writes there)."""
        root = self.results_root
        return None if root is None else root / self.allocation_id / self.job_id


# ---- updates ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """The work began (emitted by ``execute``, not by executors)."""


@dataclass(frozen=True, slots=True)
class Ready:
    """A gang replica is prepared and waits for the server's go (emitted by the supervisor,
    not by executors; ``agent/gang_gate.py``)."""


@dataclass(frozen=True, slots=True)
class Progress:
    fraction: float  # 0..1, never decreasing within one run
    step: int = 0
    total: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class Preview:
    image: bytes
    mime: str = "image/png"
    step: int = 0


@dataclass(frozen=True, slots=True)
class LogLine:
    line: str
    stream: str = "stdout"  # "stdout" | "stderr" | "agent"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: str  # where a later attempt can resume from
    step: int = 0
    progress: float = 0.0


@dataclass(frozen=True, slots=True)
class Result:
    """A result file: its bytes, or (``path``) the file that holds them, read only when it is
    sent, a chunk at a time when large (``data`` is then empty)."""

    name: str
    data: bytes
    mime: str = "application/octet-stream"
    path: Path | None = None

    @property
    def size(self) -> int:
        return self.path.stat().st_size if self.path is not None else len(self.data)

    def read(self) -> bytes:
        """The bytes (of a small result: a large one is uploaded from its file)."""
        return self.path.read_bytes() if self.path is not None else self.data


@dataclass(frozen=True, slots=True)
class Finished:
    results: tuple[Result, ...] = ()
    modified: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    interrupted: bool = False  # stopped early on request: results are partial

    def __post_init__(self) -> None:
        object.__setattr__(self, "modified", frozen_map(self.modified))


@dataclass(frozen=True, slots=True)
class Failed:
    error: str
    retryable: bool
    stopped: StopReason | None = None  # set when the failure is an obeyed stop


Update = Ready | Started | Progress | Preview | LogLine | Checkpoint | Finished | Failed
Terminal = Finished | Failed


def is_terminal(update: Update) -> bool:
    return isinstance(update, Finished | Failed)


# ---- stopping --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StopRequest:
    reason: StopReason
    grace_s: float
    note: str = ""  # why, in words, e.g. "timed out after 30s"


class StopSignal:
    """The supervisor's way to tell a running executor to stop.

    The first request wins: a later one cannot change the reason (a cancel
    after an interrupt is still an interrupt), but it may shorten the grace.
    Reading ``requested`` is safe from handler threads.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._request: StopRequest | None = None
        self._future: asyncio.Future[None] | None = None

    @property
    def requested(self) -> StopRequest | None:
        return self._request

    def request(self, reason: StopReason, grace_s: float = 0.0, note: str = "") -> bool:
        """Ask the work to stop. Returns True when this is the first request."""
        if grace_s < 0:
            raise ValueError("grace_s must be >= 0")
        if self._request is not None:
            if grace_s < self._request.grace_s:
                self._request = StopRequest(self._request.reason, grace_s, self._request.note)
            return False
        self._request = StopRequest(reason, grace_s, note)
        self._event.set()
        if self._future is not None and not self._future.done():
            self._future.set_result(None)
        return True

    def future(self) -> asyncio.Future[None]:
        """A future done once a stop is requested: to pass to ``asyncio.wait`` or to watch
        with a callback, without a task per waiter. Shared: never cancel it (read the
        request from ``requested``)."""
        if self._future is None or self._future.cancelled():
            self._future = asyncio.get_running_loop().create_future()
            if self._request is not None:
                self._future.set_result(None)
        return self._future

    async def wait(self) -> StopRequest:
        await self._event.wait()
        assert self._request is not None
        return self._request


def stopped_terminal(
    request: StopRequest,
    results: tuple[Result, ...] = (),
    modified: Mapping[str, str] = EMPTY,
) -> Terminal:
    """The terminal update that obeys ``request`` (shared by every executor)."""
    note = f": {request.note}" if request.note else ""
    if request.reason is StopReason.INTERRUPT:
        return Finished(results, modified, interrupted=True)
    if request.reason is StopReason.PREEMPT:
        return Failed(f"preempted{note}", retryable=True, stopped=request.reason)
    if request.reason is StopReason.TIMEOUT:
        return Failed(f"timed out{note}", retryable=False, stopped=request.reason)
    return Failed(f"cancelled{note}", retryable=False, stopped=request.reason)


# ---- the protocol ----------------------------------------------------------


class Executor(Protocol):
    """Runs assignments. ``name`` is the backend name jobs ask for."""

    @property
    def name(self) -> str: ...

    def run(self, assignment: JobWork, stop: StopSignal) -> AsyncIterator[Update]:
        """Yield the updates of one run, ending with exactly one terminal update."""
        ...


def monotone(progress: Progress, last: float) -> Progress:
    """``progress`` clamped to 0..1 and never below ``last`` (what was already reported)."""
    fraction = max(last, min(1.0, max(0.0, progress.fraction)))
    return Progress(fraction, progress.step, progress.total, progress.message)


def sniff_mime(data: bytes) -> str:
    """The MIME type of common result bytes, by their magic numbers."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:1] in (b"{", b"["):
        return "application/json"
    return "application/octet-stream"
