"""``corral up``: a server on SQLite and a local agent, in one process, in one command.

The quick start: it serves the API, the dashboard and the agent link, and
connects an agent for this machine (its GPUs if NVML finds them, otherwise
CPU slots running the demo executor). ``--demo`` also submits a few jobs so
there is work to watch, and starts the reference AUTOMATIC1111 and ComfyUI
backends on CPU (``up_backends.py``) for the local agent, so their drop-in
APIs answer existing clients with real images and no GPU. Ctrl-C lets
running work checkpoint, stops the agent, then the server.

The admin token is generated on the first run and kept in
``<data-dir>/admin-token`` (readable by you only), so every run can print it;
the local agent joins with it too. For a real deployment run ``corral
server`` and ``corral agent`` separately and use agent join tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli import loop as event_loop

if TYPE_CHECKING:
    from corral.agent.main import Agent

DEMO_PROMPTS = (
    "a red barn at dawn",
    "cattle under a storm sky",
    "a lasso on a fence post",
    "sunset over the prairie",
    "a horse in tall grass",
    "a windmill at night",
)


def register(app: typer.Typer) -> None:
    """Add ``corral up`` to the ``corral`` command."""
    app.command("up")(up)


def up(
    demo: Annotated[bool, typer.Option(help="Also submit a few demo jobs to watch.")] = False,
    port: Annotated[
        int,
        typer.Option(
            help="HTTP port (API and dashboard); 0 picks one.",
            min=0,
            max=65535,
            envvar="CORRAL_UP_PORT",
        ),
    ] = 8470,
    agent_port: Annotated[
        int,
        typer.Option(
            help="Port agents dial; 0 picks one.", min=0, max=65535, envvar="CORRAL_UP_AGENT_PORT"
        ),
    ] = 8471,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    data_dir: Annotated[
        Path,
        typer.Option(help="Where the database, blobs and admin token live.", envvar="CORRAL_HOME"),
    ] = Path("~/.corral"),
    fake_gpus: Annotated[
        str | None, typer.Option(help='Give the local agent pretend GPUs: "1x RTX 4090 24GiB".')
    ] = None,
    handler: Annotated[
        str | None, typer.Option(help="Run jobs with this Python function: module:function.")
    ] = None,
) -> None:
    """Start a server on SQLite and a local agent; print the URL and the admin token."""
    from corral.cli import up_running
    from corral.core.errors import InvalidSpec

    home = data_dir.expanduser()
    if (other := up_running.running(home)) is not None:
        typer.echo(f"corral up: already running at {other[1]}/ (pid {other[0]})", err=True)
        raise typer.Exit(1)
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: the server's state
        token = admin_token(home)
        event_loop.run(_up(home, token, host, port, agent_port, demo, fake_gpus, handler))
    except InvalidSpec as exc:
        typer.echo(f"corral up: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        typer.echo(f"corral up: {exc}", err=True)
        raise typer.Exit(1) from None


def admin_token(home: Path) -> str:
    """The admin token kept in ``home/admin-token``; made (mode 0600) on the first run."""
    path = home / "admin-token"
    if path.exists():
        return path.read_text().strip()
    token = f"corral_admin_{secrets.token_urlsafe(32)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


async def _up(
    home: Path,
    token: str,
    host: str,
    port: int,
    agent_port: int,
    demo: bool,
    fake_gpus: str | None,
    handler: str | None,
) -> None:
    from corral.agent.fingerprint import detect_inventory
    from corral.cli.up_backends import demo_backends
    from corral.server.settings import Settings

    cpu_only = not detect_inventory(fake_gpus).snapshot().gpus
    settings = Settings(
        home=home,
        admin_token=token,  # type: ignore[arg-type]
        api={"host": host, "port": port},  # type: ignore[arg-type]
        agents={"port": agent_port},  # type: ignore[arg-type]
        compat={"gpus": 0 if cpu_only else 1},  # type: ignore[arg-type]
        log_level="warning",
    )
    async with demo_backends(demo) as backends:
        await _serve(settings, token, host, demo, fake_gpus, handler, backends)


async def _serve(
    settings: Any,
    token: str,
    host: str,
    demo: bool,
    fake_gpus: str | None,
    handler: str | None,
    backends: Any,
) -> None:
    """Serve, run the local agent, stop both in order on Ctrl-C."""
    from corral.agent.main import Agent, AgentOptions
    from corral.cli import up_running
    from corral.server.app import create_app, create_plane
    from corral.server.serving import uvicorn_config

    home = settings.home
    sock = _bind(host, settings.api.port)
    settings.api.port = sock.getsockname()[1]  # agents fetch model files from here
    plane = create_plane(settings)  # TLS (self-signed) only when listening beyond this machine
    tls = plane.tls
    app = create_app(plane=plane)
    server = _quiet_server(
        uvicorn_config(
            app, settings.api, log_level="warning", timeout_graceful_shutdown=2,
            loop=event_loop.choice(),
            ssl_certfile=tls.cert if tls else None, ssl_keyfile=tls.key if tls else None,
        )
    )  # fmt: skip
    served = asyncio.create_task(server.serve(sockets=[sock]))
    with _signals() as stopping:
        while not server.started and not served.done():
            await asyncio.sleep(0.02)
        if served.done():
            served.result()  # startup failed: say why
            return
        base = _url(sock, "https" if tls else "http")
        address = str(getattr(plane.link, "address", ""))
        options = AgentOptions(
            servers=(address,), token=token, fake_gpus=fake_gpus, handler=handler,
            ca_fingerprint=tls.fingerprint if tls else None,
            work_dir=home / "agent", shutdown_grace_s=3.0,
            a1111=backends.a1111, comfyui=backends.comfyui,
            default_backend="demo" if backends.a1111 or backends.comfyui else None,
        )  # fmt: skip
        agent = Agent(options)
        linked = asyncio.create_task(agent.run(), name="corral-up-agent")
        _banner(base, address, token, home, agent)
        up_running.record(home, base)
        if tls is not None:
            print(f"  TLS certificate: {tls.cert}  fingerprint: {tls.fingerprint}", flush=True)
        event_loop.settle_heap()  # server and agent started: that much lives until Ctrl-C
        extras = [asyncio.create_task(_compat_banner(base, backends, agent))]
        extras += (
            [asyncio.create_task(_demo(base, token, tls.cert if tls else None))] if demo else []
        )
        await _until_stopped(stopping, served, linked)
        print("\ncorral: stopping the agent, then the server ...", flush=True)
        await agent.shutdown()
        for task in (linked, *extras):
            task.cancel()
        await asyncio.gather(linked, *extras, return_exceptions=True)
        server.should_exit = True
        await served
    up_running.forget(home)
    print("corral: stopped", flush=True)


def _quiet_server(config: Any) -> Any:
    """uvicorn's server without its own signal handling (``corral up`` stops it in order)."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer(config)


@contextlib.contextmanager
def _signals() -> Iterator[asyncio.Event]:
    """An event set by the first SIGINT/SIGTERM; a second one exits at once."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def on_signal() -> None:
        if stopping.is_set():
            os._exit(130)  # a second Ctrl-C: the user does not want to wait
        stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        yield stopping
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _until_stopped(stopping: asyncio.Event, *tasks: asyncio.Task[Any]) -> None:
    waiter = asyncio.create_task(stopping.wait())
    await asyncio.wait({waiter, *tasks}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            print(f"corral: {task.get_name()} failed: {task.exception()}", flush=True)


def _banner(base: str, address: str, token: str, home: Path, agent: Agent) -> None:
    gpus = agent.gpus.snapshot().gpus
    what = f"{len(gpus)} GPU(s)" if gpus else "CPU only, demo executor"
    body = '{"payload": {"prompt": "a red barn", "steps": 20}}'
    print(
        "\n".join(
            [
                "corral is up",
                f"  dashboard:   {base}/",
                # The token rides in the fragment, which a browser never sends: the server
                # (and any proxy's log) never sees it; the page trades it for a cookie.
                f"  log in:      {base}/#token={token}   (one click, no pasting)",
                f"  API:         {base}/v1   (docs: {base}/docs)",
                f"  admin token: {token}",
                f"               (kept in {home / 'admin-token'})",
                f"  agents dial: {address}   (local agent {agent.node}: {what})",
                "  submit a job:",
                f"    curl -X POST {base}/v1/jobs -H 'Authorization: Bearer {token}' \\",
                f"         -H 'Content-Type: application/json' -d '{body}'",
                "Ctrl-C stops the agent and the server.",
            ]
        ),
        flush=True,
    )


async def _compat_banner(base: str, backends: Any, agent: Agent) -> None:
    """How to point an existing AUTOMATIC1111 or ComfyUI client at corral (once it answers)."""
    if not (backends.a1111 or backends.comfyui):
        return
    await agent.link.connected.wait()
    if backends.a1111:
        print(f"  AUTOMATIC1111 API: {base}/sdapi/v1   (basic auth: any user, the admin token)")
    if backends.comfyui:
        print(f"  ComfyUI API:       {base}/prompt, {base}/ws   (same credentials)", flush=True)


async def _demo(base: str, token: str, cert: Path | None) -> None:
    """Submit one demo job per prompt and print each as it ends."""
    import ssl

    import httpx

    from corral.core.pins import pinned_context

    headers = {"Authorization": f"Bearer {token}"}
    verify = pinned_context(ssl.PEM_cert_to_DER_cert(cert.read_text())) if cert else True
    async with httpx.AsyncClient(
        base_url=base, headers=headers, timeout=10, verify=verify
    ) as client:
        jobs = [
            {"backend": "demo", "payload": {"prompt": p, "steps": 25, "step_s": 0.12}}
            for p in DEMO_PROMPTS
        ]
        # One key for every run: a restart shows the jobs of the first run, not a second set.
        key = {"Idempotency-Key": "corral-up-demo"}
        reply = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=key)
        reply.raise_for_status()
        ids = [j["id"] for j in reply.json()["jobs"]]
        if reply.status_code == 200:
            print(f"demo: the {len(ids)} demo jobs of an earlier run, at {base}/#jobs", flush=True)
        else:
            print(f"demo: submitted {len(ids)} jobs; watch them at {base}/", flush=True)
        pending = set(ids)
        while pending:
            await asyncio.sleep(0.5)
            for job_id in sorted(pending):
                job = (await client.get(f"/v1/jobs/{job_id}")).json()
                if job["state"] in ("succeeded", "failed", "cancelled"):
                    pending.discard(job_id)
                    urls = ", ".join(base + f["url"] for f in job.get("result") or [])
                    print(f"demo: {job_id} {job['state']} on {job['node']}  {urls}", flush=True)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def _url(sock: socket.socket, scheme: str) -> str:
    host, port = sock.getsockname()[:2]
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
