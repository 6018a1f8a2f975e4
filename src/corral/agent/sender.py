"""The writing half of the agent's stream: reports, heartbeats and model reports out.

One task (``Sender.run``) is the only writer of a session's stream. It takes
what is queued, turns it into messages (uploading a checkpoint, or results too
large to ride inline, first) and writes them, then waits for more. When the
server reads bundles (its Welcome says so) everything queued leaves in one
write (``corral.proto.bundles``): an idle agent still writes each report the
moment it is queued, a busy one writes fewer, fuller messages. A start waits
a moment (``LinkSettings.start_linger_s``) for its job's end, so work that
ends at once costs one write, not two.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc

from corral.agent import wire
from corral.agent.blobs import size_and_sha, upload
from corral.agent.checkpoints import CheckpointCourier
from corral.agent.executors.base import Checkpoint, Failed, Started
from corral.agent.orders import Done, JobResult, Report
from corral.agent.produced import ProducedFiles
from corral.proto import bundles, caller
from corral.proto.gen.corral.v1 import agent_pb2 as pb

if TYPE_CHECKING:
    from corral.agent.link import LinkSettings

log = logging.getLogger("corral.agent.link")

_UPLOAD_REFUSED = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "DATA_LOSS", "PERMISSION_DENIED")

Item = Report | pb.Heartbeat | pb.ModelStatus
Queued = tuple[int, Item]


class Sender:
    def __init__(
        self,
        settings: LinkSettings,
        outbox: dict[int, Report],
        checkpoints: CheckpointCourier,
        metadata: Sequence[tuple[str, str | bytes]],
    ) -> None:
        self.settings = settings
        self.outbox = outbox  # the link's: reports kept until acknowledged, by seq
        self.checkpoints = checkpoints
        self.metadata = metadata
        self.bundles = False  # the connected server reads AgentBundle (its Welcome says)
        self.live: asyncio.Queue[Queued] | None = None  # the session's queue, while it runs
        self.produced: ProducedFiles | None = None  # results kept for next steps here

    async def run(self, call: Any, stub: Any, live: asyncio.Queue[Queued]) -> None:
        """Write what is queued, then wait for more, until the stream breaks."""
        self.live = live
        while True:
            batch = [await live.get()]
            while self.bundles and not live.empty():
                batch.append(live.get_nowait())
            if self.bundles and open_starts(batch):
                await linger(live, batch, self.settings.start_linger_s)
            made = [await self._message(stub, seq, item) for seq, item in batch]
            messages = [m for m in made if m is not None]
            if len(messages) > 1:
                messages = bundles.pack(messages, bundles.agent_bundle)
            for msg in messages:
                await call.write(msg)

    async def _message(self, stub: Any, seq: int, item: Item) -> pb.AgentMessage | None:
        """``item`` as a message, after its uploads; None when it must wait (see ``_later``)."""
        if isinstance(item, pb.Heartbeat):
            return pb.AgentMessage(seq=seq, heartbeat=item)
        if isinstance(item, pb.ModelStatus):
            return pb.AgentMessage(seq=seq, models=item)
        if self._superseded(seq, item):
            return None
        try:
            blob_ids = await self._upload_large(stub, item)
        except grpc.aio.AioRpcError as exc:
            wait_s = retry_after_s(exc)
            if wait_s is not None:  # the server holds all the uploads it may: later
                self._later(seq, item, wait_s)
                return None
            if exc.code().name not in _UPLOAD_REFUSED:
                raise  # the connection broke: the result is resent after a reconnect
            item = self._replace(seq, item, f"the server refused a result: {exc.details()}")
            blob_ids = {}
        return wire.update_message(seq, item, blob_ids)

    def _superseded(self, seq: int, report: Report) -> bool:
        """A checkpoint with a newer one of its job already queued is dropped unsent (and
        forgotten): only the latest is ever resumed from, so on a slow link the uploads
        skip to it instead of falling behind the sampling."""
        if not isinstance(report.update, Checkpoint):
            return False
        newer = any(
            later > seq
            and isinstance(other.update, Checkpoint)
            and (other.allocation_id, other.attempt, other.job_id)
            == (report.allocation_id, report.attempt, report.job_id)
            for later, other in self.outbox.items()
        )
        if newer:
            self.outbox.pop(seq, None)
        return newer

    def _later(self, seq: int, report: Report, wait_s: float) -> None:
        """Queue ``report`` again in ``wait_s`` (it stays in the outbox meanwhile: a
        reconnect resends it anyway); what comes after it goes out now."""
        live = self.live
        if live is not None:
            log.info("%s: the server is busy; upload again in %.0fs", report.allocation_id, wait_s)
            asyncio.get_running_loop().call_later(wait_s, live.put_nowait, (seq, report))

    def _replace(self, seq: int, report: Report, error: str) -> Report:
        """A result the server will never take becomes a failure (also in the outbox)."""
        log.error("allocation %s: %s", report.allocation_id, error)
        failed = Report(report.allocation_id, report.attempt, Failed(error, retryable=False))
        if seq in self.outbox:
            self.outbox[seq] = failed
        return failed

    async def _upload_large(self, stub: Any, report: Report) -> dict[int, str]:
        """Upload a checkpoint, or the results too large to ride inline; blob ids by index."""
        if isinstance(report.update, Checkpoint):
            return await self.checkpoints.ship(stub, report)
        done = report.update if isinstance(report.update, Done) else report.before
        if done is None:
            return {}
        s, inline, blob_ids = self.settings, 0, {}
        for i, jr in enumerate(done.results):
            size = jr.result.size
            if size > s.inline_bytes or inline + size > s.inline_total_bytes:
                blob_ids[i] = await self._upload(stub, report, jr)
            else:
                inline += size
        return blob_ids

    async def _upload(self, stub: Any, report: Report, jr: JobResult) -> str:
        chunk = pb.BlobChunk(
            allocation_id=report.allocation_id,
            attempt=report.attempt,
            name=f"{jr.job_id}/{jr.result.name}",
            mime=jr.result.mime,
        )
        source = jr.result.path or jr.result.data  # a file is read a chunk at a time
        known = await size_and_sha(source)
        blob_id = await upload(stub, self.metadata, chunk, source, self.settings.chunk_bytes, known)
        if self.produced is not None:  # a next step here reads it without a transfer
            await self.produced.keep(known[1], source)
        return blob_id


def retry_after_s(exc: grpc.aio.AioRpcError) -> float | None:
    """How long the server asks to wait before uploading again (a cap on unfinished uploads,
    which frees up with time), or None for a refusal waiting cannot cure."""
    for key, value in exc.trailing_metadata() or ():
        if key == caller.RETRY_AFTER:
            try:
                return max(1.0, float(value))
            except ValueError:
                return None
    return None


def open_starts(batch: list[Queued]) -> bool:
    """Whether a start in ``batch`` has no end (success or failure) after it in ``batch``."""
    waiting: set[str] = set()
    for _, item in batch:
        if not isinstance(item, Report):
            continue
        if isinstance(item.update, Started):
            waiting.add(item.allocation_id)
        elif isinstance(item.update, Done | Failed):
            waiting.discard(item.allocation_id)
    return bool(waiting)


async def linger(live: asyncio.Queue[Queued], batch: list[Queued], linger_s: float) -> None:
    """Wait up to ``linger_s`` for the ends of the starts in ``batch``, adding what is queued
    meanwhile (in order) to ``batch``.

    Work that ends at once (a no-op handler, a cached answer) then sends its
    start and its end in one write instead of two, and the server handles them
    as one (``AgentInbound.ran``), also when several jobs start and end at once
    on a busy agent; work that takes longer has its start reported ``linger_s``
    late, and what was queued with it waits as long.
    """
    try:
        async with asyncio.timeout(linger_s):
            while open_starts(batch):
                batch.append(await live.get())
                while not live.empty():
                    batch.append(live.get_nowait())
    except TimeoutError:
        return
