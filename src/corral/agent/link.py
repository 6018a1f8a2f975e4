"""The agent's end of the link: dial out, say hello, keep the stream, resync after a drop.

The agent opens the connection (so a GPU behind NAT or a firewall works),
authenticates with its join token and says hello with its full inventory and
every allocation it holds. Then three tasks share the stream: a writer (the
only one that writes), a reader (assignments, stops, intake, acks) and a
heartbeat ticker (live GPU figures; also feeds the VRAM guard).

Updates the server must not miss (started, checkpoint, finished, failed) stay
in an outbox until the server acknowledges them, and are resent after a
reconnect; progress, previews and logs are sent when connected and dropped
otherwise (the next one supersedes them). Results too large for a stream
message are uploaded first in chunks (resumable and idempotent: see the
server's ``grpc_uploads``).

When the stream breaks the client waits a jittered, exponentially growing
delay and dials the next server URL in its list (several replicas behind one
PostgreSQL, or one server). A refused token is fatal: retrying cannot help;
so is a server whose certificate is not the pinned one (``trust.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from corral.agent import wire
from corral.agent.checkpoints import CheckpointCourier
from corral.agent.executors.base import Checkpoint, Preview, Ready, Started
from corral.agent.fingerprint import FakeGpus, GpuInventory, GpuSnapshot
from corral.agent.inputs import InputCourier
from corral.agent.model_report import ModelReporter, api_base, hint, token_headers
from corral.agent.orders import Report
from corral.agent.produced import ProducedFiles
from corral.agent.sender import Queued, Sender
from corral.agent.supervisor import Supervisor
from corral.agent.trust import ServerTrust
from corral.core import Clock, CorralError, InvalidSpec, LinkError
from corral.core.pins import CertificateMismatch
from corral.proto import bundles, caller
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.proto.gen.corral.v1 import agent_pb2_grpc as pb_grpc

log = logging.getLogger("corral.agent.link")

DEFAULT_AGENT_PORT = 8471
_FATAL = ("UNAUTHENTICATED", "PERMISSION_DENIED")


class LinkRefused(CorralError):
    """The server refused this agent's token: reconnecting cannot help."""


@dataclass(frozen=True, slots=True)
class Target:
    """One server to dial."""

    address: str  # host:port
    tls: bool
    url: str  # as given

    def __str__(self) -> str:
        return f"{'grpcs' if self.tls else 'grpc'}://{self.address}"


def parse_server(url: str) -> Target:
    """``grpc://h:p``, ``grpcs://h:p``, ``h:p`` or ``http(s)://h`` (then the default agent port)."""
    text = url.strip()
    if not text:
        raise InvalidSpec("server", "empty server URL")
    parts = urlsplit(text if "://" in text else f"grpc://{text}")
    if parts.scheme not in ("grpc", "grpcs", "http", "https") or not parts.hostname:
        raise InvalidSpec(
            "server", f"{url!r}: write grpc://host:port (the address `corral server` prints)"
        )
    try:
        given = parts.port
    except ValueError:
        raise InvalidSpec("server", f"{url!r}: the port is not a number") from None
    web = parts.scheme in ("http", "https")  # the API's URL: agents use the agent port
    port = DEFAULT_AGENT_PORT if web or given is None else given
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return Target(f"{host}:{port}", parts.scheme in ("grpcs", "https"), url)


def backoff_s(failures: int, rng: random.Random, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """Delay before the next dial: exponential in ``failures``, half of it random (equal jitter).

    The jitter spreads a fleet's reconnects after a server restart, so a
    thousand agents do not all dial in the same instant.
    """
    delay = min(cap_s, base_s * 2.0 ** max(0, failures - 1))
    return delay / 2 + rng.uniform(0.0, delay / 2)


@dataclass(frozen=True, slots=True)
class LinkSettings:
    token: str
    inline_bytes: int = 1024 * 1024  # a result up to this size rides in the Finished message
    inline_total_bytes: int = 4 * 1024 * 1024  # ... as long as the message stays below this
    chunk_bytes: int = 256 * 1024  # upload chunk size for larger results
    max_message_bytes: int = 8 * 1024 * 1024
    max_preview_bytes: int = 2 * 1024 * 1024  # larger previews are dropped, not sent
    welcome_timeout_s: float = 15.0
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    heartbeat_s: float | None = None  # beat at least this often (default: as the server asks)
    shared_storage: tuple[Path, ...] = ()  # checkpoints under these are reported by path
    max_checkpoint_bytes: int = 512 * 1024 * 1024  # larger ones are reported by path only
    start_linger_s: float = 0.005  # a start waits this long for its job's end, to share a write
    # Ping the server this often: a half-open connection is found. At least twice the
    # server's agents.min_ping_interval_s (10 s), or it ends the connection (too_many_pings).
    keepalive_s: float = 20.0


class LinkClient:
    def __init__(  # noqa: PLR0913 (the link's seams, each passed in)
        self,
        targets: Sequence[Target],
        settings: LinkSettings,
        supervisor: Supervisor,
        identity: wire.Identity,
        gpus: GpuInventory,
        clock: Clock,
        *,
        checkpoint_root: Path | None = None,
        results_root: Path | None = None,
        rng: random.Random | None = None,
        reporter: ModelReporter | None = None,
        trust: ServerTrust | None = None,
        dial: Callable[[Target], Any] | None = None,  # opens a channel (default: gRPC's)
    ) -> None:
        if not targets:
            raise InvalidSpec("server", "give at least one server URL")
        self.targets = list(targets)
        self.settings = settings
        self.supervisor = supervisor
        self.identity = identity
        self.gpus = gpus
        self.clock = clock
        self.checkpoint_root = checkpoint_root
        self.results_root = results_root  # result files wait there (``wire.order_from``)
        self.rng = rng or random.Random()
        self.trust = trust or ServerTrust()  # how grpcs:// servers are trusted (trust.py)
        self._dial = dial or self._grpc_channel
        self._tls: tuple[object, list[tuple[str, str]]] | None = None  # for the next dial
        self.connected = asyncio.Event()
        self.server: Target | None = None  # the one connected to
        self.sessions = 0  # welcomed sessions so far
        self.heartbeat_s = 5.0  # until the server says
        self._outbox: dict[int, Report] = {}
        self._live: asyncio.Queue[Queued] | None = None
        self._seq = itertools.count(1)
        self._metadata = caller.metadata(settings.token, identity.node, identity.key)
        supervisor.sink = self.publish
        self._stub: Any = None  # the connected session's, for checkpoint downloads
        self.checkpoints = CheckpointCourier(
            self._metadata,
            chunk_bytes=settings.chunk_bytes,
            max_bytes=settings.max_checkpoint_bytes,
            shared=settings.shared_storage,
            stub=lambda: self._stub,
            connected=self.connected,
            scratch=checkpoint_root,
        )
        supervisor.prepare = self.checkpoints.prepare
        work_root = checkpoint_root or Path(tempfile.gettempdir()) / "corral-agent"
        produced = ProducedFiles(work_root / "produced")  # results kept for next steps here
        supervisor.inputs = InputCourier(self.checkpoints.download, work_root / "inputs", produced)
        self.sender = Sender(settings, self._outbox, self.checkpoints, self._metadata)
        self.sender.produced = produced
        self.reporter = reporter  # tells the server about the model cache (model_report.py)
        self.models = reporter.models if reporter else None  # prefetch hints go there
        self.api_base = ""  # the server's HTTP API, for the model files it holds

    def publish(self, report: Report) -> None:
        """Send ``report`` (the supervisor's sink); keep it until acknowledged if it matters."""
        update = report.update
        if isinstance(update, Preview) and len(update.image) > self.settings.max_preview_bytes:
            log.warning("dropping a %d-byte preview of %s", len(update.image), report.job_id)
            return
        seq = next(self._seq)
        if report.terminal or isinstance(update, Ready | Started | Checkpoint):
            self._outbox[seq] = report
        if self._live is not None:
            self._live.put_nowait((seq, report))

    @property
    def unacknowledged(self) -> int:
        return len(self._outbox)

    async def drain(self, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) until the server has acknowledged everything sent."""
        deadline = self.clock.now() + timeout_s
        while self._outbox and self.clock.now() < deadline:
            await self.clock.sleep(0.05)
        return not self._outbox

    async def run(self) -> None:
        """Stay connected until cancelled. Raises ``LinkRefused`` when the token is refused."""
        failures, index = 0, 0
        while True:
            target = self.targets[index % len(self.targets)]
            welcomed_before = self.sessions
            try:
                await self._session(target)
                reason = "the server closed the stream"
            except (LinkError, OSError, TimeoutError, asyncio.InvalidStateError) as exc:
                # InvalidStateError: a write raced the stream's end ("RPC already finished")
                reason = str(exc) or type(exc).__name__
            except (LinkRefused, CertificateMismatch):
                raise
            except Exception as exc:  # a bug must not take the agent off the network
                log.exception("link to %s failed", target)
                reason = f"{type(exc).__name__}: {exc}"
            failures = 1 if self.sessions > welcomed_before else failures + 1
            index += 1  # try the next server (the same one when there is only one)
            delay = backoff_s(
                failures, self.rng, self.settings.backoff_base_s, self.settings.backoff_cap_s
            )
            reason = self.trust.explain(reason)
            log.warning("link to %s: %s; dialling again in %.1fs", target, reason, delay)
            await self.clock.sleep(delay)

    async def _session(self, target: Target) -> None:
        if target.tls:  # checks the pin, if any, before anything is sent (trust.py)
            self._tls = await self.trust.credentials(target.address, str(target))
        async with self._dial(target) as channel:
            stub = pb_grpc.AgentLinkStub(channel)
            call = stub.Connect(metadata=self._metadata)
            try:
                early = await self._hello(call, target)
                live: asyncio.Queue[Queued] = asyncio.Queue()
                for seq in sorted(self._outbox):  # resend what the server has not acknowledged
                    live.put_nowait((seq, self._outbox[seq]))
                self._live, self.server, self._stub = live, target, stub
                for msg in early:  # what came in one bundle with the Welcome
                    self._obey(msg)
                self.sessions += 1
                self.connected.set()
                log.info("connected to %s as node %s", target, self.identity.node)
                tasks = [self.sender.run(call, stub, live), self._read(call), self._beat(live)]
                if self.reporter is not None:
                    tasks.append(self._report_models(live, self.reporter))
                await _first_to_end(*tasks)
            except grpc.aio.AioRpcError as exc:
                raise _translate(exc) from None
            finally:
                self._live, self._stub = None, None
                self.connected.clear()
                call.cancel()

    def _grpc_channel(self, target: Target) -> Any:
        size = self.settings.max_message_bytes
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", size),
            ("grpc.max_receive_message_length", size),
            ("grpc.keepalive_time_ms", round(self.settings.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # One connection per agent, never one shared by the agents of a process (corral
            # up, tests, benchmarks): the server caps the streams of each connection
            # (agents.max_streams_per_connection), and one agent needs only a few.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if target.tls and self._tls is not None:
            creds, more = self._tls
            return grpc.aio.secure_channel(target.address, creds, options + more)
        return grpc.aio.insecure_channel(target.address, options)

    async def _hello(self, call: Any, target: Target) -> Sequence[pb.ServerMessage]:
        """Say hello, read the Welcome; returns what came with it in the same bundle."""
        snapshot = self.gpus.snapshot()
        inventory = wire.inventory(self.identity, snapshot, self.supervisor.held())
        if self.reporter is not None:  # the model cache is part of the inventory
            status = self.reporter.status()
            inventory.models_on_disk[:] = status.models_on_disk
            for backend, loaded in status.loaded_by_backend.items():
                inventory.loaded_by_backend[backend].CopyFrom(loaded)
        hello = pb.AgentMessage(
            seq=next(self._seq),
            hello=pb.Hello(inventory=inventory, bundles=True, node_key=self.identity.key),
        )
        with contextlib.suppress(grpc.aio.AioRpcError):
            # The server may end the call before the hello is written (it refused the token);
            # the write then fails with a generic error and read() raises the real status.
            await call.write(hello)
        # asyncio.timeout, not wait_for: on 3.11 wait_for returns the inner result (here the
        # dead server's UNAVAILABLE) when a cancel races its completion, and the cancel is lost;
        # run() then dials on and whoever cancelled it (Ctrl-C, a test's teardown) waits forever.
        async with asyncio.timeout(self.settings.welcome_timeout_s):
            got = await call.read()
        inner = [] if got is grpc.aio.EOF else list(bundles.unpack_server(got))
        if not inner or not inner[0].HasField("welcome"):
            raise LinkError("the server did not answer the hello with a welcome")
        msg, rest = inner[0], inner[1:]
        if msg.welcome.heartbeat_interval_s > 0:
            self.heartbeat_s = msg.welcome.heartbeat_interval_s
        if self.settings.heartbeat_s is not None:
            self.heartbeat_s = min(self.heartbeat_s, self.settings.heartbeat_s)
        self.api_base = api_base(target.address, target.tls, msg.welcome)
        self.sender.bundles = msg.welcome.bundles
        self.supervisor.gang.enabled = msg.welcome.gang_go
        return rest

    async def _read(self, call: Any) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            for one in bundles.unpack_server(msg):
                self._obey(one)

    def _obey(self, msg: pb.ServerMessage) -> None:
        body = msg.WhichOneof("body")
        if body == "assign":
            order = wire.order_from(
                msg.assign, self.checkpoint_root, self.api_base, self.results_root
            )
            self.supervisor.assign(order)
        elif body == "prefetch" and self.models is not None:
            hint(self.models, msg.prefetch, self.api_base)
        elif body == "stop":
            allocation_id, reason, grace_s = wire.stop_from(msg.stop)
            if msg.stop.job_id:  # one job of a batch, stopped on its own
                self.supervisor.stop_job(allocation_id, msg.stop.job_id, reason, grace_s)
            else:
                self.supervisor.stop(allocation_id, reason, grace_s)
        elif body == "go":
            self.supervisor.gang.go(msg.go.allocation_id)
        elif body == "intake":
            self.supervisor.intake_open = not msg.intake.paused
        elif body == "ack":
            report = self._outbox.pop(msg.ack.seq, None)
            if report is not None and report.terminal:
                self.supervisor.acknowledge(report.allocation_id)
            if msg.ack.status in ("stale", "unknown"):
                log.info("server: update of %s was %s", msg.ack.allocation_id, msg.ack.status)

    async def _beat(self, live: asyncio.Queue[Queued]) -> None:
        while True:
            await self.clock.sleep(self.heartbeat_s)
            if isinstance(self.gpus, FakeGpus):  # a demo's cards look as busy as their work
                self.gpus.follow_work(self.supervisor.busy_gpus(), self.heartbeat_s)
            try:
                snapshot = self.gpus.snapshot()
            except Exception as exc:  # a driver hiccup must not stop the heartbeats
                log.warning("GPU reading failed: %s", exc)
                snapshot = GpuSnapshot(note=str(exc))
            owners = self.supervisor.process_owners()
            self.supervisor.check_vram(snapshot, owners)
            live.put_nowait((next(self._seq), wire.heartbeat(snapshot, owners, self.clock.now())))

    async def _report_models(self, live: asyncio.Queue[Queued], reporter: ModelReporter) -> None:
        """The model cache's state after the Welcome, then whenever it changes."""
        reporter.reconnected()
        while True:
            status = reporter.status()
            await reporter.describe(status, self.clock.now())
            live.put_nowait((next(self._seq), status))
            await reporter.wait_change()

    def model_headers(self, source: str) -> dict[str, str]:
        """The agent's token goes to the server's own model files, and nowhere else."""
        return token_headers(self.api_base, self.settings.token, source)


async def _first_to_end(*coroutines: Any) -> None:
    """Run ``coroutines`` until one ends; cancel the others; re-raise its error.

    The others are awaited through ``gather``: a cancel of this task that lands while they
    wind down propagates (awaiting each under ``suppress(CancelledError)`` swallowed it).
    """
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _translate(exc: grpc.aio.AioRpcError) -> CorralError:
    code, details = exc.code(), exc.details() or ""
    if code.name in _FATAL:
        return LinkRefused(details or code.name)
    return LinkError(f"{code.name}: {details}" if details else code.name)
