"""The agent's composition root: options in, a connected agent out.

This is the only place on the agent side that picks real implementations:
the wall clock, the GPU inventory (NVML, ``--fake-gpus`` or none), the
executors this node offers, the supervisor and the link. ``corral agent``
and ``corral up`` both build their agent here.

Executors offered: ``demo`` always (a CPU image generator, see ``demo.py``);
``a1111`` / ``comfyui`` with ``--a1111 URL`` / ``--comfyui URL``; ``python``
with ``--handler module:function``; ``command`` with ``--command``. Jobs that
name no backend go to the handler if there is one, else to the first HTTP
backend configured, else to the demo; ``train`` jobs go to ``command`` when
it is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from corral import __version__
from corral.agent import backend_models
from corral.agent.backend_info import ObjectInfoProbe
from corral.agent.demo import DemoExecutor
from corral.agent.executors.base import Executor
from corral.agent.executors.command import CommandExecutor
from corral.agent.executors.http_a1111 import A1111Executor
from corral.agent.executors.http_comfyui import ComfyUIExecutor
from corral.agent.executors.python import PythonExecutor
from corral.agent.executors.warm import MODULE_NAME
from corral.agent.fingerprint import GpuInventory, NvmlInventory, detect_inventory
from corral.agent.link import LinkClient, LinkRefused, LinkSettings, Target, parse_server
from corral.agent.memory import offered
from corral.agent.model_report import ModelReporter
from corral.agent.models import ModelManager, ModelSettings
from corral.agent.supervisor import SHUTDOWN_GRACE_S, Supervisor
from corral.agent.topology import Topology, parse_fake
from corral.agent.trust import ServerTrust
from corral.agent.wire import Identity
from corral.core import Clock, InvalidSpec, WallClock
from corral.core.model import EMPTY
from corral.core.pins import parse_fingerprint, parse_join
from corral.core.rendezvous import ADDRESS_LABEL

log = logging.getLogger("corral.agent")

FLUSH_S = 3.0
"""On shutdown, how long to wait for the server to acknowledge the last results."""


def cpu_slots(gpus: int, cpu_count: int | None = None) -> float:
    """The CPU slots an agent offers when not told (``--cpus``): the machine's CPU count,
    and at least one per GPU.

    Every job takes CPU slots (one by default), so a box with fewer cores than GPUs would
    otherwise leave GPUs idle for want of a slot: a GPU job's CPU mostly feeds its GPU,
    and sharing cores among those feeders costs less than an idle card. The agent says so
    when it raises the count, so that CPU-heavy work can be given a true ``--cpus``.
    """
    cores = cpu_count if cpu_count is not None else os.cpu_count() or 1
    if gpus <= cores:
        return float(cores)
    log.warning(
        "%d CPUs for %d GPUs: offering %d CPU slots (one per GPU) so every GPU can take a "
        "one-CPU job; start the agent with --cpus to offer another number",
        cores,
        gpus,
        gpus,
    )
    return float(gpus)


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Everything ``corral agent`` can be told."""

    servers: tuple[str, ...]
    token: str  # the agent token, or a join string that also pins the server (core/pins.py)
    name: str | None = None
    fake_gpus: str | None = None
    fake_topology: str | None = None  # with fake_gpus: "numa=0,0,1,1; nvlink=0-1,2-3"
    handler: str | None = None
    command: str | None = None
    preload: tuple[str, ...] = ()  # modules a Python --command's runs start with (warm start)
    default_backend: str | None = None  # jobs naming none run here (default: see build_executors)
    a1111: str | None = None  # base URL of an AUTOMATIC1111 webui started with --api
    comfyui: str | None = None  # base URL of a ComfyUI server
    a1111_models: Path | None = None  # the webui's models/Stable-diffusion (cached models go there)
    comfyui_models: Path | None = None  # ComfyUI's models/checkpoints
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    cpus: float | None = None  # CPU slots, to a milli-CPU (None: ``cpu_slots``)
    memory: int | None = None  # bytes offered to memory requests (None: RAM less the reserve)
    memory_reserve: int | None = None  # bytes kept back from RAM (None: agent/memory.py's)
    address: str | None = None  # reachable by other nodes (a gang's rendezvous); see reachable
    work_dir: Path = Path("~/.corral/agent")
    models_dir: Path | None = None  # the model cache (default <work_dir>/models)
    models_budget: str | int = "100GiB"  # disk the model cache may use
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    shared_storage: tuple[Path, ...] = ()  # checkpoints under these are reported, not uploaded
    ca_fingerprint: str | None = None  # pin the server's certificate (sha256:<hex>)
    ca_cert: Path | None = None  # trust this CA (PEM) for the server instead of the system's


def reachable(server: str) -> str:
    """This machine's address on its route to ``server`` (``host:port``): the address other
    nodes of the cluster most likely reach it at too (they reach the same server). No packet
    is sent: connecting a UDP socket only picks the route. The host name when it has none."""
    host, _, port = server.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port or 0) or 1))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def parse_labels(items: Sequence[str]) -> dict[str, str]:
    """``["gpu=4090", "zone=home,owner=me"]`` -> a dict; a bad item names the ``labels`` option."""
    labels: dict[str, str] = {}
    for item in items:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise InvalidSpec("labels", f"{pair!r}: write key=value")
            labels[key.strip()] = value.strip()
    return labels


class Agent:
    """One node's agent: supervisor + link, on one event loop."""

    def __init__(
        self, options: AgentOptions, clock: Clock | None = None, gpus: GpuInventory | None = None
    ) -> None:
        if not options.token:
            raise InvalidSpec("token", "an agent join token is required (--token or --join)")
        targets = [parse_server(url) for url in options.servers]
        token, trust = server_trust(options, targets)
        self.options = options
        self.clock = clock or WallClock()
        self.gpus = gpus or detect_inventory(options.fake_gpus)
        work_dir = options.work_dir.expanduser()
        topology = detect_topology(options, self.gpus)
        executors, default, by_kind = build_executors(options, self.clock, work_dir, topology)
        cache = ModelSettings.parse(
            options.models_dir or work_dir / "models", options.models_budget
        )
        self.models = ModelManager.open(
            cache, self.clock, headers_for=self._model_headers, transport=trust.http_transport()
        )
        self.supervisor = Supervisor(
            executors, self.clock, default=default, by_kind=by_kind, models=self.models
        )
        self.identity = Identity(
            node=options.name or socket.gethostname(),
            cpus=options.cpus
            if options.cpus is not None
            else cpu_slots(len(self.gpus.snapshot().gpus)),
            memory_bytes=offered(options.memory, options.memory_reserve),
            labels={ADDRESS_LABEL: options.address or reachable(targets[0].address)}
            | dict(options.labels),
            backends=tuple(sorted(executors)),
            version=__version__,
            key=node_key(work_dir),
            topology=topology,
        )
        self.link = LinkClient(
            targets,
            LinkSettings(token=token, shared_storage=options.shared_storage),
            self.supervisor,
            self.identity,
            self.gpus,
            self.clock,
            checkpoint_root=work_dir / "checkpoints",
            results_root=fresh_scratch(work_dir / "results"),
            reporter=ModelReporter(
                self.models, self._native_models, executors, backend_infos(options)
            ),
            trust=trust,
        )
        self.supervisor.on_change = self.link.reporter.mark if self.link.reporter else lambda: None
        self.supervisor.on_lacking = self._lacked
        self._probes: set[asyncio.Task[None]] = set()

    @property
    def node(self) -> str:
        return self.identity.node

    def _model_headers(self, source: str) -> dict[str, str]:
        return self.link.model_headers(source)

    def _native_models(self) -> tuple[tuple[str, ...], Mapping[str, tuple[str, ...]]]:
        """The backends' own models (not from the cache): on disk, and loaded per backend."""
        return self.identity.models_on_disk, self.identity.loaded

    async def run(self) -> None:
        """Stay connected until cancelled; raises ``LinkRefused`` for a bad token."""
        note = self.gpus.snapshot().note
        if note:
            log.info("%s", note)
        await self.note_backend_models()
        self.supervisor.warm_up()  # the zygotes import while the agent connects
        await self.link.run()

    async def note_backend_models(self) -> None:
        """Put the HTTP backends' models in what the agent reports (backend_models.py):
        at the start, and again when a backend refused work for a model it lacks."""
        if not (self.options.a1111 or self.options.comfyui):
            return
        found = await backend_models.probe(self.options.a1111, self.options.comfyui)
        loaded = {**self.identity.loaded, **found.loaded}
        self.identity = replace(self.identity, models_on_disk=found.on_disk, loaded=loaded)
        self.link.identity = self.identity
        if self.link.reporter is not None:
            self.link.reporter.mark()

    def _lacked(self) -> None:
        """A backend refused work for a model it lacks: its lists were stale, ask again (once
        at a time: a burst of such failures needs one new listing)."""
        if self._probes:
            return
        task = asyncio.get_running_loop().create_task(self.note_backend_models())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def shutdown(self) -> None:
        """Let running work checkpoint and report, then give the server a moment to take it."""
        await self.supervisor.shutdown(self.options.shutdown_grace_s)
        await self.link.drain(FLUSH_S)
        await self.models.aclose()  # partial downloads stay for the next start


def backend_infos(options: AgentOptions) -> dict[str, ObjectInfoProbe]:
    """The backends whose description the agent reports (ComfyUI's ``/object_info``)."""
    return {"comfyui": ObjectInfoProbe(options.comfyui)} if options.comfyui else {}


def server_trust(options: AgentOptions, targets: Sequence[Target]) -> tuple[str, ServerTrust]:
    """The bare agent token, and how the server's certificate is trusted: the join string's
    pin, ``--ca-fingerprint``, ``--ca-cert``, or the system's CAs (docs/security/tls.md)."""
    join = parse_join(options.token, "token")
    given = parse_fingerprint(options.ca_fingerprint) if options.ca_fingerprint else None
    if join.fingerprint and given and join.fingerprint != given:
        raise InvalidSpec("ca_fingerprint", "differs from the fingerprint in the join string")
    trust = ServerTrust(join.fingerprint or given, options.ca_cert)
    plain = [str(t) for t in targets if not t.tls]
    if (trust.fingerprint or trust.ca_file) and plain:
        raise InvalidSpec(
            "server", f"{plain[0]} is not TLS: a pinned or CA-checked server is grpcs://"
        )
    return join.token, trust


def fresh_scratch(folder: Path) -> Path:
    """The folder where result files wait to be sent, emptied: what a previous run left
    there belongs to ends the server has (or that are lost with that run's outbox)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def node_key(work_dir: Path) -> str:
    """This installation's secret, made on first start and kept in ``<work_dir>/node-key``
    (owner-only): the server binds the node name to it, so another agent (a cloned machine,
    or someone with the join token) cannot take over a live node's name and its work."""
    path = work_dir / NODE_KEY
    with contextlib.suppress(FileNotFoundError):
        key = path.read_text().strip()
        if len(key) == KEY_CHARS and all(c in "0123456789abcdef" for c in key):
            return key
        raise InvalidSpec("work_dir", f"{path} is not a node key: remove it to make a new one")
    work_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(KEY_CHARS // 2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


NODE_KEY = "node-key"
KEY_CHARS = 64


def detect_topology(options: AgentOptions, gpus: GpuInventory) -> Topology | None:
    """The GPUs' layout: given (``--fake-topology``), else NVML's, else unknown."""
    if options.fake_topology:
        return parse_fake(options.fake_topology, len(gpus.snapshot().gpus))
    if isinstance(gpus, NvmlInventory):
        return gpus.topology()
    return None


def build_executors(
    options: AgentOptions, clock: Clock, work_dir: Path, topology: Topology | None = None
) -> tuple[dict[str, Executor], str, dict[str, str]]:
    """The executors this node offers, the default one, and defaults per job kind."""
    executors: dict[str, Executor] = {"demo": DemoExecutor(clock)}
    default, by_kind = "demo", {}
    if options.comfyui:
        executors["comfyui"] = ComfyUIExecutor(
            options.comfyui, clock, models_dir=options.comfyui_models
        )
        default = "comfyui"
    if options.a1111:
        executors["a1111"] = A1111Executor(options.a1111, clock, models_dir=options.a1111_models)
        default = "a1111"
    if options.preload and not options.command:
        raise InvalidSpec("preload", "warms the runs of --command: give --command too")
    if options.command:
        workdir = work_dir / "runs"
        workdir.mkdir(parents=True, exist_ok=True)
        argv = shlex.split(options.command)
        executors["command"] = CommandExecutor(
            clock,
            argv,
            allow_payload_command=False,
            workdir=workdir,
            topology=topology,
            preload=preload_modules(options.preload),
        )
        by_kind["train"] = "command"
    if options.handler:
        executors["python"] = PythonExecutor(options.handler, clock)
        default = "python"
    if options.default_backend:
        if options.default_backend not in executors:
            known = ", ".join(sorted(executors))
            raise InvalidSpec(
                "default_backend", f"{options.default_backend!r} is not one of {known}"
            )
        default = options.default_backend
    return executors, default, by_kind


def preload_modules(modules: Sequence[str]) -> tuple[str, ...]:
    """``--preload``'s module names, checked: a bad one names the ``preload`` option."""
    for name in modules:
        if not MODULE_NAME.fullmatch(name):
            raise InvalidSpec("preload", f"{name!r} is not a module name")
    return tuple(modules)


async def run_agent(options: AgentOptions, agent: Agent | None = None) -> None:
    """Run until SIGINT/SIGTERM, then shut down cleanly. Raises ``LinkRefused`` on a bad token
    (refused at once, or revoked while connected), after stopping the work it ran."""
    agent = agent or Agent(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    link = asyncio.create_task(agent.run(), name="corral-agent-link")
    waiter = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({link, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if link.done():
            refused = link.exception()
            if isinstance(refused, LinkRefused):
                # Revoked (or never valid): the server requeues this node's work elsewhere and
                # would take no result from it, so running it on is GPU time thrown away.
                log.error("the server refused this agent (%s): stopping its work", refused)
                await agent.supervisor.shutdown(0.0)
            link.result()  # raise it
            return
        log.info("shutting down: letting running work checkpoint and report")
        await agent.shutdown()
    finally:
        for task in (link, waiter):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
