"""The gRPC servicer: agents' Connect streams and blob uploads, handed to ``AgentInbound``.

One Connect stream per agent: the agent authenticates with its join token
(``authorization: Bearer <token>`` metadata), says hello with its inventory
and what it holds, and gets a Welcome followed by the reconciliation (what to
run again, what to stop). Then a reader task feeds heartbeats and allocation
updates to the inbound side, one at a time in the order sent, while the
stream writes out what the server sends (see ``grpc_link.Session``).

Updates the agent must not lose (started, checkpoint, finished, failed) are
answered with an ``UpdateAck`` carrying the server's verdict; the agent keeps
them until then and resends after a reconnect, which the inbound side
answers ``duplicate`` when it already has them. A heartbeat from a node the
server declared lost ends the stream with FAILED_PRECONDITION: the agent
reconnects and says hello, and the server reconciles.

Over 400 lines on purpose: the stream's handshake, reconciliation and reader are one
protocol, read top to bottom; blob uploads live in ``grpc_uploads.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from corral.core.clock import Clock
from corral.core.errors import Conflict, Forbidden, LimitReached, LinkError, Unauthenticated
from corral.core.model import Gpu
from corral.proto import bundles, caller
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.proto.gen.corral.v1 import agent_pb2_grpc as pb_grpc
from corral.server.agentlink import grpc_convert as convert
from corral.server.agentlink.base import Ack, Admission, AgentInbound, ResultBlob, Standing
from corral.server.agentlink.grpc_uploads import Releases, Uploader, UploadError, Uploads
from corral.server.agentlink.model_wire import report_from
from corral.server.settings import AgentLinkSettings

if TYPE_CHECKING:
    from corral.server.agentlink.grpc_link import GrpcLink, Session

log = logging.getLogger("corral.server.agentlink")

FETCH_CHUNK_BYTES = 256 * 1024
"""Checkpoint downloads travel in chunks of this size (far below the message limit)."""

MAX_IN_FLIGHT = 256
"""Allocation updates of one stream being handled at once (see ``_read``)."""

RELIABLE = frozenset({"ready", "started", "checkpoint", "finished", "failed"})
"""Update kinds the agent keeps until acknowledged; progress, previews and logs are lossy."""


class Refused(Exception):
    """End the stream with gRPC status ``code`` (a ``grpc.StatusCode`` name)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class AgentLinkService(pb_grpc.AgentLinkServicer):
    def __init__(
        self,
        link: GrpcLink,
        inbound: AgentInbound,
        uploads: Uploads,
        settings: AgentLinkSettings,
        clock: Clock,
    ) -> None:
        self.link = link
        self.inbound = inbound
        self.uploads = uploads
        self.settings = settings
        self.clock = clock
        self.releases = Releases(settings.upload_idle_s, inbound.uploads_read)
        self._updates: dict[str, Callable[[str, pb.AllocationUpdate], Awaitable[Ack]]] = {
            "ready": self._ready,
            "started": self._started,
            "progress": self._progress,
            "preview": self._preview,
            "log": self._log,
            "checkpoint": self._checkpoint,
            "finished": self._finished,
            "failed": self._failed,
        }

    async def Connect(  # the generated servicer names it
        self, requests: AsyncIterator[pb.AgentMessage], context: Any
    ) -> AsyncIterator[pb.ServerMessage]:
        admission = await self._authenticate(context)
        hello = await self._first_hello(requests, context)
        inventory = replace(
            convert.inventory_from(hello.inventory), key=hello.node_key, token=admission.token_id
        )
        try:  # before ``open``: a stream for a name held by another agent replaces nothing
            await self.inbound.claim(inventory.node, inventory.key)
        except Conflict as exc:
            await abort(context, grpc.StatusCode.ALREADY_EXISTS, str(exc))
        session = self.link.open(inventory.node)
        session.bundles = hello.bundles
        reader: asyncio.Task[None] | None = None
        release: Callable[[], None] | None = None
        try:
            release = await self._hold(admission, session, context)
            try:
                reply = await self.inbound.hello(inventory, convert.running_from(hello.inventory))
            except LinkError as exc:
                await abort(context, grpc.StatusCode.UNAVAILABLE, f"hello failed: {exc}")
            except LimitReached as exc:  # its token holds all the node names it may
                await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            session.welcome(self.link.outgoing(convert.welcome_messages(inventory.node, reply)))
            log.info("agent %s connected (%d GPUs)", inventory.node, len(inventory.gpus))
            reader = asyncio.create_task(self._read(session, requests))
            async for msg in session.messages():
                yield msg
            code, details = session.ended or ("OK", "")
            if code != "OK":
                await abort(context, getattr(grpc.StatusCode, code), details)
        finally:
            for task in (reader, session.beating):
                if task is not None:
                    task.cancel()
            if release is not None:
                release()
            self.link.release(session)
            log.info("agent %s stream ended", inventory.node)

    async def UploadBlob(self, requests: AsyncIterator[pb.BlobChunk], context: Any) -> pb.BlobAck:
        """Take an upload from the agent of the node the call names (and proves with its
        key), for that node's live work only (``grpc_uploads``)."""
        await self._authenticate(context)
        node, key = caller.node_of(context.invocation_metadata())

        async def standing(allocation_id: str, attempt: int) -> Standing:
            return await self.inbound.upload_standing(node, key, allocation_id, attempt)

        try:
            return await self.uploads.receive(requests, Uploader(node, standing))
        except UploadError as exc:
            if exc.retry_after_s is not None:  # a cap: the agent keeps its report, tries later
                context.set_trailing_metadata(((caller.RETRY_AFTER, f"{exc.retry_after_s:.0f}"),))
            await abort(context, getattr(grpc.StatusCode, exc.code), str(exc))

    async def FetchBlob(  # the generated servicer names it
        self, request: pb.BlobRequest, context: Any
    ) -> AsyncIterator[pb.BlobChunk]:
        """Stream a checkpoint blob to the allocation that resumes from it (from ``offset``)."""
        await self._authenticate(context)
        r = request
        if not await self.inbound.may_fetch(r.allocation_id, r.attempt, r.blob_id):
            await abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"blob {r.blob_id} is not a checkpoint or input of a job {r.allocation_id} runs",
            )
        try:
            for chunk in self.uploads.chunks(r, FETCH_CHUNK_BYTES):  # read as they go out
                yield chunk
        except UploadError as exc:
            await abort(context, grpc.StatusCode.NOT_FOUND, str(exc))

    async def _authenticate(self, context: Any) -> Admission:
        """The call's agent token, admitted; a call without an acceptable one is aborted."""
        token = bearer(context.invocation_metadata())
        if token is None:
            await abort(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "missing agent join token: send the metadata 'authorization: Bearer <token>' "
                "(corral agent --token)",
            )
        try:
            return await self.inbound.authenticate(token)
        except Unauthenticated as exc:
            await abort(context, grpc.StatusCode.UNAUTHENTICATED, f"agent token rejected: {exc}")
        except Forbidden as exc:
            await abort(context, grpc.StatusCode.PERMISSION_DENIED, str(exc))

    async def _hold(
        self, admission: Admission, session: Session, context: Any
    ) -> Callable[[], None]:
        """Tie the stream to its token: revoking the token ends it with UNAUTHENTICATED (the
        agent then stops for good rather than dial again) and its node leaves."""

        def end(why: str) -> bool:
            live = session.ended is None
            session.end("UNAUTHENTICATED", f"agent token rejected: {why}; ask for a new join token")
            return live

        try:
            return admission.hold(session.node, end)
        except Unauthenticated as exc:  # revoked since this stream authenticated
            await abort(context, grpc.StatusCode.UNAUTHENTICATED, f"agent token rejected: {exc}")

    async def _first_hello(
        self, requests: AsyncIterator[pb.AgentMessage], context: Any
    ) -> pb.Hello:
        try:
            async with asyncio.timeout(self.settings.hello_timeout_s):  # not wait_for: see unit.py
                first = await anext(requests)
        except (TimeoutError, StopAsyncIteration):
            first = None
        if first is None or not first.HasField("hello"):
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "the first message on a stream must be a hello",
            )
        if not first.hello.inventory.node:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "hello.inventory.node is empty")
        hello: pb.Hello = first.hello
        return hello

    async def _read(self, session: Session, requests: AsyncIterator[pb.AgentMessage]) -> None:
        """Feed the agent's messages to the inbound side until the stream ends.

        Allocation updates are not awaited one by one: each runs as a task,
        started in the order received (so each joins the inbound side's group
        commit in that order), and its ack goes out once its group committed.
        The updates of every agent thus share transactions and fsyncs. At most
        ``MAX_IN_FLIGHT`` are open per stream; other messages wait their turn.
        """
        in_flight: set[asyncio.Task[None]] = set()
        try:
            async for received in requests:
                for msg, end in paired(bundles.unpack_agent(received)):
                    await self._take(session, msg, in_flight, end)
            if in_flight:
                await asyncio.wait(in_flight)
            session.end()  # the agent closed its side
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _end_for(session, exc)

    async def _take(
        self,
        session: Session,
        msg: pb.AgentMessage,
        in_flight: set[asyncio.Task[None]],
        end: pb.AgentMessage | None = None,
    ) -> None:
        """Handle one message: an update as a task of its own (a start with the ``end`` that
        came with it, as one), anything else in turn."""
        body = msg.WhichOneof("body")
        if body == "bundle":
            raise Refused("INVALID_ARGUMENT", "a bundle inside a bundle")
        if body != "update":
            await self._handle(session, msg)
            return
        handling = self._handle(session, msg) if end is None else self._ran(session, msg, end)
        task = asyncio.create_task(handling)
        in_flight.add(task)
        task.add_done_callback(lambda t: self._settled(session, in_flight, t))
        if len(in_flight) >= MAX_IN_FLIGHT:
            await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)

    def _settled(
        self, session: Session, in_flight: set[asyncio.Task[None]], task: asyncio.Task[None]
    ) -> None:
        in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _end_for(session, task.exception())  # type: ignore[arg-type]

    async def _handle(self, session: Session, msg: pb.AgentMessage) -> None:
        body = msg.WhichOneof("body")
        if body == "heartbeat":
            self._heartbeat(session, msg.heartbeat)
        elif body == "update":
            update = msg.update
            kind = update.WhichOneof("body")
            if kind is None:
                raise Refused("INVALID_ARGUMENT", "an allocation update without a body")
            ack = await self._updates[kind](session.node, update)
            if kind in RELIABLE:
                session.send(convert.ack_message(msg.seq, update.allocation_id, ack.value))
        elif body == "hello":
            raise Refused("INVALID_ARGUMENT", "hello twice on one stream: reconnect to resync")
        elif body == "models":
            if self.link.on_models is not None:
                await self.link.on_models(session.node, report_from(msg.models))
            described = msg.models.backend_info
            if described and self.link.on_backend_info is not None:
                found = {k: (v.sha256, v.json_zlib) for k, v in described.items()}
                await self.link.on_backend_info(session.node, found)

    async def _ran(self, session: Session, start: pb.AgentMessage, end: pb.AgentMessage) -> None:
        """A start and the end that came with it (see ``paired``), as one unit; two acks."""
        u = start.update
        blobs = await self._results(end.update)
        stopped = list(end.update.finished.stopped_jobs)
        acks = await self.inbound.ran(
            session.node, u.allocation_id, u.attempt, blobs, stopped=stopped
        )
        await self._uploads_read(end.update)
        for msg, ack in zip((start, end), acks, strict=True):
            session.send(convert.ack_message(msg.seq, u.allocation_id, ack.value))

    async def _uploads_read(self, u: pb.AllocationUpdate) -> None:
        self._release_later(u.allocation_id, u.finished.results)

    def _release_later(self, allocation_id: str, results: Sequence[pb.Result]) -> None:
        """The server took these results (or refused them for good): their uploads go
        (``Releases``)."""
        self.releases.later(allocation_id, [r.blob_id for r in results if r.blob_id])

    def close(self) -> None:
        """Forget the deletions not yet due (the server stops; those uploads stay)."""
        self.releases.close()

    def _heartbeat(self, session: Session, hb: pb.Heartbeat) -> None:
        """Note the heartbeat without making the stream wait for the store.

        The write runs in the background, one at a time per node (a beat that
        arrives while one is being written is covered by it), so a slow store
        delays ``last_seen`` a little instead of stalling every agent's stream.
        """
        self.link.stats.heartbeat(self.clock.now() - hb.sent_at if hb.sent_at else None)
        if session.beating is None or session.beating.done():
            gpus = convert.gpus_from(hb.gpus) or None
            session.beating = asyncio.create_task(self._beat(session, gpus))

    async def _beat(self, session: Session, gpus: tuple[Gpu, ...] | None) -> None:
        try:
            await self.inbound.heartbeat(session.node, gpus)
        except LinkError as exc:  # lost or unknown: the agent must say hello again
            session.end("FAILED_PRECONDITION", str(exc))
        except Exception:
            log.exception("agent %s: heartbeat failed", session.node)
            session.end("UNAVAILABLE", "the server failed to record a heartbeat; reconnect")

    async def _ready(self, node: str, u: pb.AllocationUpdate) -> Ack:
        return await self.inbound.ready(node, u.allocation_id, u.attempt)

    async def _started(self, node: str, u: pb.AllocationUpdate) -> Ack:
        return await self.inbound.started(node, u.allocation_id, u.attempt)

    async def _progress(self, node: str, u: pb.AllocationUpdate) -> Ack:
        return await self.inbound.progress(
            node,
            u.allocation_id,
            u.attempt,
            u.progress.fraction,
            job_id=u.job_id or None,
            message=convert.progress_message(u.progress),
        )

    async def _preview(self, node: str, u: pb.AllocationUpdate) -> Ack:
        if not u.job_id or not u.preview.image:
            return Ack.UNKNOWN
        image, mime = u.preview.image, u.preview.mime or "image/png"
        return await self.inbound.preview(node, u.allocation_id, u.attempt, u.job_id, image, mime)

    async def _log(self, node: str, u: pb.AllocationUpdate) -> Ack:
        line = convert.log_line(u.log)
        return await self.inbound.log(
            node, u.allocation_id, u.attempt, [line], job_id=u.job_id or None
        )

    async def _checkpoint(self, node: str, u: pb.AllocationUpdate) -> Ack:
        c = u.checkpoint
        if c.blob_id and not self.uploads.owns(u.allocation_id, u.attempt, c.blob_id):
            return Ack.UNKNOWN  # an agent cannot name another allocation's upload
        ref = f"blob:{c.blob_id}" if c.blob_id else c.path
        return await self.inbound.checkpoint(
            node, u.allocation_id, u.attempt, ref, job_id=u.job_id or None, step=int(c.step)
        )

    async def _finished(self, node: str, u: pb.AllocationUpdate) -> Ack:
        blobs = await self._results(u)
        if u.finished.modified:
            changes = ", ".join(f"{k}={v}" for k, v in sorted(u.finished.modified.items()))
            line = f"[agent] the agent changed the request: {changes}"
            await self.inbound.log(node, u.allocation_id, u.attempt, [line])
        stopped = list(u.finished.stopped_jobs)
        modified = dict(u.finished.modified)
        ack = await self.inbound.finished(
            node, u.allocation_id, u.attempt, blobs, stopped=stopped, modified=modified
        )
        await self._uploads_read(u)
        return ack

    async def _results(self, u: pb.AllocationUpdate) -> list[ResultBlob]:
        return self._blobs(u.allocation_id, u.attempt, u.finished.results)

    def _blobs(
        self, allocation_id: str, attempt: int, results: Sequence[pb.Result]
    ) -> list[ResultBlob]:
        """Results on the wire: inline, or the blobs the agent uploaded (linked under
        ``results/`` by the server, never read into its memory)."""
        blobs = []
        for r in results:
            mime = r.mime or "application/octet-stream"
            try:
                upload = (
                    self.uploads.stored_for(allocation_id, attempt, r.blob_id)
                    if r.blob_id
                    else None
                )
            except UploadError as exc:
                raise Refused("FAILED_PRECONDITION", f"result {r.name}: {exc}") from None
            blobs.append(ResultBlob(r.job_id, r.name, r.data, mime, upload))
        return blobs

    async def _failed(self, node: str, u: pb.AllocationUpdate) -> Ack:
        f = u.failed
        ack = await self.inbound.failed(
            node,
            u.allocation_id,
            u.attempt,
            f.error,
            retryable=f.retryable,
            job_id=u.job_id,
            finished=list(f.finished_jobs),
            results=self._blobs(u.allocation_id, u.attempt, f.results),
        )
        self._release_later(u.allocation_id, f.results)
        return ack


Pair = tuple[pb.AgentMessage, pb.AgentMessage | None]


def paired(messages: Sequence[pb.AgentMessage]) -> Iterator[Pair]:
    """``messages`` in order, each ``started`` update with its allocation's ``finished`` when
    that is the next message naming the allocation (same attempt, nothing changed by the
    agent): work that ended at once, whose agent sent both in one bundle. The end is then
    left out of the order; other allocations' messages are independent of the pair.
    """
    if len(messages) < 2:
        yield from ((m, None) for m in messages)
        return
    following: dict[int, int] = {}  # message index -> the next message naming its allocation
    last: dict[str, int] = {}
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.WhichOneof("body") == "update":
            key = m.update.allocation_id
            if key in last:
                following[i] = last[key]
            last[key] = i
    merged: set[int] = set()
    for i, m in enumerate(messages):
        if i in merged:
            continue
        j = following.get(i)
        if j is not None and _ends(m, messages[j]):
            merged.add(j)
            yield m, messages[j]
        else:
            yield m, None


def _ends(start: pb.AgentMessage, end: pb.AgentMessage) -> bool:
    s, e = start.update, end.update
    return (
        s.WhichOneof("body") == "started"
        and e.WhichOneof("body") == "finished"
        and e.attempt == s.attempt
        and not e.finished.modified
    )


def _end_for(session: Session, exc: BaseException) -> None:
    """End the stream for a message that could not be handled, with the status that says why."""
    if session.ended is not None:  # already ending (revoked, replaced): a read it cut short
        return
    if isinstance(exc, Refused):
        session.end(exc.code, exc.details)
    elif isinstance(exc, LinkError):
        session.end("ABORTED", "this stream was replaced or ended")
    else:
        log.error("agent %s: message handling failed", session.node, exc_info=exc)
        session.end("UNAVAILABLE", "the server failed to handle a message; reconnect")


async def abort(context: Any, code: grpc.StatusCode, details: str) -> NoReturn:
    """End the call with ``code`` (``context.abort`` raises; this says so to the type checker)."""
    await context.abort(code, details)
    raise AssertionError("context.abort returned")


def bearer(metadata: Any) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry, if any."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            scheme, _, token = str(value).partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None
