"""``AgentLink`` over gRPC: the server's end of the agents' Connect streams.

Each connected agent has one ``Session``: the queue of messages its open
Connect stream writes out. ``GrpcLink.assign`` / ``stop`` / ``set_intake``
put a message on that queue, or raise ``LinkError`` when the node has no
stream (the intent is in the store; the agent gets it again at its next
hello). A node whose stream ends is *not* lost here: the liveness loop
decides that after ``node_timeout_s`` without a heartbeat.

A session is registered *before* the server answers the agent's hello, and
holds back what the scheduler sends meanwhile until the Welcome has gone
out. Registering after the hello would lose an assignment placed in
between; sending it before the Welcome would break the protocol's order.
A second stream for the same node (the agent restarted, or its old
connection is half-open) replaces the first, which is ended.

``start`` binds the port and serves ``grpc_service.AgentLinkService``.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from corral.core.clock import Clock
from corral.core.errors import LinkError
from corral.proto import bundles
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.proto.gen.corral.v1 import agent_pb2_grpc as pb_grpc
from corral.server.agentlink import grpc_convert as convert
from corral.server.agentlink.base import AgentInbound, Assignment, StopOrder
from corral.server.agentlink.grpc_service import AgentLinkService
from corral.server.agentlink.grpc_uploads import Uploads
from corral.server.agentlink.model_wire import (
    ModelRef,
    ModelReport,
    RefLookup,
    attach_refs,
    no_refs,
    prefetch_message,
)
from corral.server.blobs import BlobStore
from corral.server.settings import AgentLinkSettings

log = logging.getLogger("corral.server.agentlink")

KEEPALIVE_MS = 20_000
"""Ping an idle connection this often, so a half-open one (a NAT that forgot it) is found."""

KEEPALIVE_TIMEOUT_MS = 10_000
"""A ping unanswered this long ends the connection."""

PING_STRIKES = 2
"""Pings closer together than ``min_ping_interval_s`` that a connection may send; the next
one ends it with GOAWAY too_many_pings (gRPC's own default: a client that pings too often
backs off, a flood ends)."""


ACK_LINGER_S = 0.005
"""How long acknowledgements alone wait for other messages to share their write: no
latency is added (an ack only lets the agent forget a report) and a few milliseconds
span the gap between a finished job's ack and the agent's next assignment."""


class Session:
    """One agent's open Connect stream, as the rest of the server sees it."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.outbox: asyncio.Queue[pb.ServerMessage | None] = asyncio.Queue()
        self.ended: tuple[str, str] | None = None  # (gRPC status name, details)
        self._held: list[pb.ServerMessage] | None = []  # None once welcomed
        self.beating: asyncio.Task[None] | None = None  # the heartbeat being recorded
        self.bundles = False  # the agent reads ServerBundle (its Hello says)

    async def messages(self) -> AsyncIterator[pb.ServerMessage]:
        """What to write, until the session ends: each time, all that is queued.

        An idle stream writes each message as it comes; while a write is under
        way, messages queue up and leave together as one bundle (when the
        agent reads bundles), so a busy agent costs one write per batch.
        """
        while (msg := await self.outbox.get()) is not None:
            batch = [msg]
            self._drain(batch)
            if self.bundles and all(m.HasField("ack") for m in batch):
                await self._linger(batch)
            for out in bundles.pack(batch, bundles.server_bundle):
                yield out

    def _drain(self, batch: list[pb.ServerMessage]) -> None:
        while self.bundles and not self.outbox.empty():
            more = self.outbox.get_nowait()
            if more is None:
                self.outbox.put_nowait(None)  # write what came before, then end
                return
            batch.append(more)

    async def _linger(self, batch: list[pb.ServerMessage]) -> None:
        """Acks alone wait up to ``ACK_LINGER_S`` for company (the agent's next work, more acks).

        An ack's only effect is that the agent may forget a report it keeps for
        resending, so it can wait: a busy agent then reads its acks with its
        next assignment instead of in a write of their own.
        """
        try:
            async with asyncio.timeout(ACK_LINGER_S):
                more = await self.outbox.get()
        except TimeoutError:
            return
        if more is None:
            self.outbox.put_nowait(None)
            return
        batch.append(more)
        self._drain(batch)

    def send(self, msg: pb.ServerMessage) -> None:
        if self.ended is not None:
            raise LinkError(f"node {self.node}: its stream has ended")
        if self._held is not None:
            self._held.append(msg)
        else:
            self.outbox.put_nowait(msg)

    def welcome(self, messages: list[pb.ServerMessage]) -> None:
        """Queue the Welcome and the hello's reconciliation, then what was held back."""
        sent = {m.assign.allocation_id for m in messages if m.HasField("assign")}
        for msg in messages:
            self.outbox.put_nowait(msg)
        for msg in self._held or []:
            if msg.HasField("assign") and msg.assign.allocation_id in sent:
                continue  # already in the hello's answer
            self.outbox.put_nowait(msg)
        self._held = None

    def end(self, code: str = "OK", details: str = "") -> None:
        """Close the stream (the first reason given wins)."""
        if self.ended is None:
            self.ended = (code, details)
            self.outbox.put_nowait(None)


LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass
class LinkStats:
    """Figures for benchmarks and logs; also exported to Prometheus once ``export`` is called."""

    connects: int = 0
    heartbeats: int = 0
    lag_s: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    _lag: Any = None  # the Prometheus histogram, when exported
    _beats: Any = None

    def export(self, registry: CollectorRegistry, sessions: Callable[[], int]) -> None:
        Gauge(
            "corral_agent_streams", "Agents connected to this server", registry=registry
        ).set_function(sessions)
        self._beats = Counter("corral_agent_heartbeats", "Heartbeats received", registry=registry)
        self._lag = Histogram(
            "corral_agent_heartbeat_lag_seconds",
            "From the agent sending a heartbeat to the server handling it",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    def heartbeat(self, lag_s: float | None) -> None:
        self.heartbeats += 1
        if self._beats is not None:
            self._beats.inc()
        if lag_s is not None:
            self.lag_s.append(lag_s)
            if self._lag is not None:
                self._lag.observe(max(0.0, lag_s))


class GrpcLink:
    """Implements ``corral.server.agentlink.base.AgentLink`` over agents' gRPC streams."""

    def __init__(self, settings: AgentLinkSettings, api_host: str = "127.0.0.1") -> None:
        self.settings = settings
        self.host = settings.host or api_host
        self.sessions: dict[str, Session] = {}
        self.stats = LinkStats()
        self.address: str | None = None  # grpc://host:port once started
        self._server: Any = None
        self._uploads: Uploads | None = None
        self._service: AgentLinkService | None = None
        # Models (issue 10, see model_wire.py): registry lookups for assignments, where agents
        # find the server's model files, and who hears the agents' model reports.
        self.model_refs: RefLookup = no_refs
        self.api_url = ""
        self.api_port = 0
        self.on_models: Callable[[str, ModelReport], Awaitable[None]] | None = None
        # what agents' backends offer (ComfyUI's /object_info): node, backend -> (digest, body)
        self.on_backend_info: (
            Callable[[str, dict[str, tuple[str, bytes]]], Awaitable[None]] | None
        ) = None

    async def assign(self, node: str, assignment: Assignment) -> None:
        self._session(node).send(attach_refs(convert.assign_message(assignment), self.model_refs))

    async def prefetch(self, node: str, refs: list[ModelRef]) -> None:
        """Suggest models for ``node`` to download ahead of demand."""
        self._session(node).send(prefetch_message(refs))

    def outgoing(self, messages: list[pb.ServerMessage]) -> list[pb.ServerMessage]:
        """The hello's answer with model refs on its assignments and the API's location."""
        for msg in messages:
            if msg.HasField("welcome"):
                msg.welcome.api_url = self.api_url
                msg.welcome.api_port = self.api_port
                msg.welcome.bundles = True
                msg.welcome.gang_go = True
            attach_refs(msg, self.model_refs)
        return messages

    async def stop(self, node: str, order: StopOrder) -> None:
        self._session(node).send(convert.stop_message(order))

    async def set_intake(self, node: str, *, open: bool) -> None:
        self._session(node).send(convert.intake_message(open))

    async def go(self, node: str, allocation_id: str, attempt: int) -> None:
        go = pb.Go(allocation_id=allocation_id, attempt=attempt)
        self._session(node).send(pb.ServerMessage(go=go))

    def _session(self, node: str) -> Session:
        session = self.sessions.get(node)
        if session is None:
            raise LinkError(f"node {node} is not connected")
        return session

    def open(self, node: str) -> Session:
        """A new session for ``node``; an older one is ended (the newest connection wins)."""
        old = self.sessions.get(node)
        if old is not None:
            old.end("ABORTED", f"node {node} connected again; this stream is replaced")
        session = Session(node)
        self.sessions[node] = session
        self.stats.connects += 1
        return session

    def release(self, session: Session) -> None:
        session.end()
        if self.sessions.get(session.node) is session:
            del self.sessions[session.node]

    async def start(
        self,
        inbound: AgentInbound,
        blobs: BlobStore,
        clock: Clock,
        registry: CollectorRegistry | None = None,
    ) -> str:
        """Listen for agents; returns the address they dial (``grpc://host:port``)."""
        s = self.settings
        if registry is not None:
            self.stats.export(registry, lambda: len(self.sessions))
        uploads = self._uploads = Uploads(
            blobs,
            clock,
            max_bytes=s.max_blob_bytes,
            idle_s=s.upload_idle_s,
            per_node=s.max_uploads_per_node,
            total=s.max_uploads,
        )
        _check_open_files(s.max_connections)
        server = grpc.aio.server(options=server_options(s))
        service = self._service = AgentLinkService(self, inbound, uploads, s, clock)
        pb_grpc.add_AgentLinkServicer_to_server(service, server)
        shown = f"[{self.host}]" if ":" in self.host else self.host
        port = self._bind(server, f"{shown}:{s.port}")
        await server.start()
        self._server = server
        scheme = "grpcs" if s.tls_cert else "grpc"
        self.address = f"{scheme}://{shown}:{port}"
        log.info("agent link listening on %s", self.address)
        return self.address

    def _bind(self, server: Any, where: str) -> int:
        s = self.settings
        try:
            if s.tls_cert and s.tls_key:
                creds = grpc.ssl_server_credentials([(_read(s.tls_key), _read(s.tls_cert))])
                port = server.add_secure_port(where, creds)
            elif s.tls_cert or s.tls_key:
                raise LinkError("agents.tls_cert and agents.tls_key must be given together")
            else:
                port = server.add_insecure_port(where)
        except RuntimeError as exc:
            raise OSError(f"agent link cannot listen on {where}: {exc}") from None
        if not port:
            raise OSError(f"agent link cannot listen on {where}")
        return int(port)

    async def close(self, grace_s: float = 1.0) -> None:
        """End every stream and stop listening; agents reconnect to another replica or later."""
        for session in list(self.sessions.values()):
            session.end("UNAVAILABLE", "the server is shutting down")
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        if self._uploads is not None:
            self._uploads.close()
        if self._service is not None:
            self._service.close()


def server_options(s: AgentLinkSettings) -> list[tuple[str, int]]:
    """The agent port's gRPC options: message sizes, keepalive both ways, and the limits that
    bound what a connection may cost (docs/security/agents.md)."""
    return [
        ("grpc.max_receive_message_length", s.max_message_bytes),
        ("grpc.max_send_message_length", s.max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # keep probing a quiet agent's connection
        # An agent pings every 20 s (agent/link.py); pings closer than this are strikes.
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(s.min_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", PING_STRIKES),
        ("grpc.server_handshake_timeout_ms", _ms(s.hello_timeout_s)),
        ("grpc.max_connection_idle_ms", _ms(s.idle_connection_s)),
        ("grpc.max_allowed_incoming_connections", s.max_connections),
        ("grpc.max_concurrent_streams", s.max_streams_per_connection),
    ]


def _check_open_files(max_connections: int) -> None:
    """Warn when the agent port may take every descriptor the process has (the API and the
    database need some too): ``agents.max_connections`` should stay below ``ulimit -n``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and max_connections >= soft:
        log.warning(
            "agents.max_connections (%d) is not below this process's open-file limit (%d, "
            "ulimit -n): agents could take the descriptors the API needs; lower the setting "
            "or raise the limit",
            max_connections,
            soft,
        )


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _read(path: Path) -> bytes:
    return path.expanduser().read_bytes()
