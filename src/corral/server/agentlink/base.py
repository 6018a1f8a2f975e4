"""The agent link seam: what the server tells agents, and what agents tell the server.

Two small protocols meet here:

* ``AgentLink`` (outbound, server -> agent): assign an allocation, stop one
  (with a reason and a grace period), pause or resume a node's intake. The
  gRPC implementation lives next to this module; ``inprocess.InProcessLink``
  is the stub tests use. Methods raise ``LinkError`` when the node is not
  connected: the server keeps the intent in the store and the agent gets it
  again when it says hello.
* ``AgentInbound`` (inbound, agent -> server): hello with the inventory and
  what it runs, heartbeats, and allocation updates. ``services.agents``
  implements it; every update names the allocation *and its attempt*, and the
  server accepts work only from the current attempt (the fencing token).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from corral.core.model import EMPTY, Gpu, InputFile, JobKind
from corral.core.states import StopReason
from corral.server.blobs import StoredBlob


class Ack(StrEnum):
    """The server's answer to an allocation update."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # already recorded (a retried upload): harmless
    STALE = "stale"  # not the current attempt (fenced out) or already ended: dropped
    UNKNOWN = "unknown"  # no such allocation on this node


class Standing(StrEnum):
    """What an agent may upload for an allocation (``AgentInbound.upload_standing``)."""

    LIVE = "live"  # its node's current attempt, not ended: it may upload
    ENDED = "ended"  # its node's attempt, ended: it may only learn what it stored already
    FOREIGN = "foreign"  # no such allocation, another node's, another attempt, or a wrong key


@dataclass(frozen=True, slots=True)
class JobWork:
    """One job inside an assignment: what the executor needs to run it."""

    job_id: str
    kind: JobKind
    payload: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    model: str | None = None
    backend: str | None = None
    timeout_s: float | None = None
    checkpoint: str | None = None  # resume from here (reported by an earlier attempt)
    checkpoint_step: int = 0  # ... at this step
    inputs: tuple[InputFile, ...] = ()  # uploaded files it reads (``inputs/<sha256>``)


@dataclass(frozen=True, slots=True)
class Assignment:
    """Run ``jobs`` (one, a batch of samples, or one gang replica) as ``allocation_id``."""

    allocation_id: str
    attempt: int
    node: str
    jobs: tuple[JobWork, ...]
    replica: int = 0
    replicas: int = 1
    gpu_indices: tuple[int, ...] = ()
    gpu_milli: int = 0
    vram_bytes: int = 0
    cpus: float = 0  # to a milli-CPU
    on_cpu: bool = False
    memory_bytes: int = 0  # host memory it holds (accounting: not enforced by the agent)
    master_addr: str = ""  # a gang's rendezvous: replica 0's node, reachable by the others
    master_port: int = 0


@dataclass(frozen=True, slots=True)
class StopOrder:
    allocation_id: str
    reason: StopReason
    grace_s: float = 0.0
    job_id: str = ""  # set: only this job of a batch (cancelled on its own); the rest run on


@dataclass(frozen=True, slots=True)
class Inventory:
    """What an agent says about its machine when it (re)connects."""

    node: str
    gpus: tuple[Gpu, ...] = ()
    cpus: float = 0  # CPU slots, to a milli-CPU
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    models_on_disk: frozenset[str] = frozenset()
    models_loaded: frozenset[str] = frozenset()
    backends: frozenset[str] = frozenset()
    agent_version: str = ""
    key: str = ""  # the agent's node key (``Hello.node_key``); "" from an agent without one
    token: str = ""  # the id of the join token that admitted the agent (its nodes count)
    numa_cpus: tuple[tuple[int, float], ...] = ()  # CPU slots per NUMA node (``Node``)
    memory_bytes: int = 0  # host memory jobs may request (``Node``); 0: not reported


@dataclass(frozen=True, slots=True)
class Running:
    """An allocation the agent runs (or holds) at hello time."""

    allocation_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class HelloReply:
    """What a (re)connecting agent must do to match the server's intent."""

    assign: tuple[Assignment, ...] = ()
    stop: tuple[StopOrder, ...] = ()
    intake_open: bool = True
    heartbeat_s: float = 5.0


@dataclass(frozen=True, slots=True)
class ResultBlob:
    """One result file of one job in a finished allocation: its bytes, or (a large one) the
    blob the agent uploaded them into, which the server links under ``results/`` without
    reading it."""

    job_id: str
    name: str
    data: bytes
    content_type: str = "application/octet-stream"
    upload: StoredBlob | None = None  # when set, the bytes are there (``data`` is empty)

    @property
    def size(self) -> int:
        return self.upload.size if self.upload is not None else len(self.data)


class AgentLink(Protocol):
    """Server -> agents. Raises ``LinkError`` if ``node`` is not connected."""

    async def assign(self, node: str, assignment: Assignment) -> None: ...

    async def stop(self, node: str, order: StopOrder) -> None: ...

    async def set_intake(self, node: str, *, open: bool) -> None: ...

    async def go(self, node: str, allocation_id: str, attempt: int) -> None:
        """Every replica of the gang is ready: launch this one (``gang_start.py``)."""
        ...


class Admission(Protocol):
    """An agent's accepted token, to which its stream is tied (docs/security/revocation.md)."""

    token_id: str  # the nodes it joins are counted against it (agents.max_nodes_per_token)

    def hold(self, node: str, end: Callable[[str], bool]) -> Callable[[], None]:
        """Hold ``node``'s stream under the token: when the token is revoked, ``end(why)`` ends
        the stream (True when it was still live) and the node leaves. Returns the release, to
        call when the stream closes; raises ``Unauthenticated`` if the token is revoked."""
        ...


class AgentInbound(Protocol):
    """Agents -> server. ``node`` is the authenticated sender; updates name allocation + attempt."""

    async def authenticate(self, token: str) -> Admission:
        """Accept an agent join token or raise ``Unauthenticated`` / ``Forbidden``."""
        ...

    async def claim(self, node: str, key: str) -> None:
        """May an agent with ``key`` connect as ``node``? Raises ``Conflict`` if another
        agent holds the name and is not lost (checked before the stream replaces any)."""
        ...

    async def hello(self, inventory: Inventory, running: Sequence[Running]) -> HelloReply: ...

    async def heartbeat(self, node: str, gpus: Sequence[Gpu] | None = None) -> None: ...

    async def started(self, node: str, allocation_id: str, attempt: int) -> Ack: ...

    async def ready(self, node: str, allocation_id: str, attempt: int) -> Ack:
        """A gang replica is prepared and waits for its go (``gang_start.py``)."""
        ...

    async def progress(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        fraction: float,
        *,
        job_id: str | None = None,
        message: str | None = None,
    ) -> Ack: ...

    async def preview(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        job_id: str,
        data: bytes,
        content_type: str = "image/png",
    ) -> Ack: ...

    async def log(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        lines: Sequence[str],
        *,
        job_id: str | None = None,
    ) -> Ack: ...

    async def checkpoint(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        ref: str,
        *,
        job_id: str | None = None,
        step: int = 0,
    ) -> Ack:
        """The latest checkpoint: ``ref`` is a shared-storage path or ``blob:<uploaded id>``."""
        ...

    async def finished(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        results: Sequence[ResultBlob],
        *,
        stopped: Sequence[str] = (),
        modified: Mapping[str, str] = EMPTY,
    ) -> Ack:
        """The allocation finished. ``stopped``: jobs of a batch stopped on their own (a
        job-level cancel or interrupt) that left no result; they end as their stop says.
        ``modified``: what the agent filled in or changed in the request (a default model,
        a drawn seed): what actually ran."""
        ...

    async def ran(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        results: Sequence[ResultBlob],
        *,
        stopped: Sequence[str] = (),
    ) -> tuple[Ack, Ack]:
        """``started`` and ``finished`` of one allocation, reported together (work that ended
        at once): the same effects and acks as the two calls, in one unit of work."""
        ...

    async def failed(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        error: str,
        *,
        retryable: bool,
        job_id: str = "",
        finished: Sequence[str] = (),
        results: Sequence[ResultBlob] = (),
    ) -> Ack:
        """The allocation failed. A batch cut short says which job failed (``job_id``) and
        which finished before it (``finished``, with their ``results``): those succeed, and
        the jobs that never ran go back to the queue without counting a failure."""
        ...

    async def stopped(self, node: str, allocation_id: str, attempt: int) -> Ack:
        """The allocation obeyed a stop order (after checkpointing, for a preemption)."""
        ...

    async def may_fetch(self, allocation_id: str, attempt: int, blob_id: str) -> bool:
        """Whether ``blob_id`` is the checkpoint, or an input file (``inputs/<sha256>``), of a
        job that this live attempt runs."""
        ...

    async def upload_standing(
        self, node: str, key: str, allocation_id: str, attempt: int
    ) -> Standing:
        """May the agent of ``node`` (proven by its node ``key``) upload for this allocation
        and attempt? Asked before an upload opens anything on the server."""
        ...

    async def uploads_read(self, allocation_id: str, blob_ids: Sequence[str]) -> None:
        """The results uploaded as ``blob_ids`` were taken (copied under ``results/``, or
        refused for good): delete the uploads. A resent report uploads them again."""
        ...
