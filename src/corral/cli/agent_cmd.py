"""``corral agent``: run the agent on a GPU machine; it dials out to the server.

The agent opens the connection itself, so it works behind NAT and firewalls.
Give it the agent address the server prints (``grpc://host:8471``, or
``grpcs://`` with TLS) and an agent join token (``POST /v1/tokens`` with
``{"kind": "agent"}``; its ``join`` string also pins a self-signed server's
certificate, docs/security/tls.md).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from corral.cli import loop as event_loop

if TYPE_CHECKING:
    from corral.agent.main import AgentOptions


def register(app: typer.Typer) -> None:
    """Add ``corral agent`` to the ``corral`` command."""
    app.command("agent")(agent)


def agent(  # noqa: PLR0913 (each option of the command is an argument)
    server: Annotated[
        list[str],
        typer.Option(
            "--server",
            help="Agent address of the server, e.g. grpc://vps.example.com:8471 (grpcs:// for "
            "TLS). Repeat it, or separate with commas, to list replicas: the agent moves on "
            "when one dies. An http(s):// URL means that host on the default agent port 8471.",
            show_default=False,
        ),
    ],
    token: Annotated[
        str | None,
        typer.Option(
            envvar="CORRAL_AGENT_TOKEN",
            help="Agent join token (a join string with a fingerprint works here too).",
            show_default=False,
        ),
    ] = None,
    join: Annotated[
        str | None,
        typer.Option(
            envvar="CORRAL_AGENT_JOIN",
            help="Join string from POST /v1/tokens: sha256:<fingerprint>::<token> (pins the "
            "server's certificate), or a plain token.",
            show_default=False,
        ),
    ] = None,
    ca_fingerprint: Annotated[
        str | None,
        typer.Option(
            help="Pin the server's certificate: the sha256:<hex> fingerprint `corral server` "
            "prints. For a self-signed server (grpcs://).",
            show_default=False,
        ),
    ] = None,
    ca_cert: Annotated[
        Path | None,
        typer.Option(
            help="Trust this CA (PEM) for the server instead of the system's CAs.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Node name. [default: this machine's host name]")
    ] = None,
    fake_gpus: Annotated[
        str | None,
        typer.Option(help='Pretend to have GPUs, for tests and demos: "2x RTX 4090 24GiB".'),
    ] = None,
    fake_topology: Annotated[
        str | None,
        typer.Option(
            help="With --fake-gpus: their layout, e.g. 'numa=0,0,1,1; nvlink=0-1,2-3; "
            "cpus=0:0-15,1:16-31' (a job is pinned to its GPUs' NUMA nodes' CPUs)."
        ),
    ] = None,
    handler: Annotated[
        str | None,
        typer.Option(help="Run jobs with this Python function: package.module:function."),
    ] = None,
    command: Annotated[
        str | None,
        typer.Option(help="Run train jobs as this command line (a subprocess per job)."),
    ] = None,
    preload: Annotated[
        list[str] | None,
        typer.Option(
            help="Warm start: a --command that is a Python script is forked from a process "
            "that has imported these modules already, e.g. torch (repeat, or comma-separated)."
        ),
    ] = None,
    a1111: Annotated[
        str | None,
        typer.Option("--a1111", help="AUTOMATIC1111 webui base URL (started with --api)."),
    ] = None,
    comfyui: Annotated[str | None, typer.Option(help="ComfyUI server base URL.")] = None,
    a1111_models: Annotated[
        Path | None,
        typer.Option(
            help="The webui's models/Stable-diffusion: registered models are linked there."
        ),
    ] = None,
    comfyui_models: Annotated[
        Path | None,
        typer.Option(help="ComfyUI's models/checkpoints: registered models are linked there."),
    ] = None,
    labels: Annotated[
        list[str] | None,
        typer.Option("--labels", "--label", help="Node labels key=value (repeat or comma-join)."),
    ] = None,
    cpus: Annotated[
        str | None,
        typer.Option(
            help="CPU slots offered, to a milli-CPU: 16, 0.5 or 500m. [default: the CPU "
            "count, and at least one per GPU (see docs/scheduler.md, CPUs)]"
        ),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            help="Host memory offered to jobs' memory requests: 64Gi, 512G, bytes. "
            "[default: RAM (or the container's limit) less --memory-reserve]"
        ),
    ] = None,
    memory_reserve: Annotated[
        str | None,
        typer.Option(
            help="Memory kept back for the system and the agent: 4Gi. [default: 5% of RAM, "
            "at least 1Gi]"
        ),
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(
            help="The address other nodes reach this one at (a gang's rendezvous). "
            "[default: this machine's address on the route to the server]"
        ),
    ] = None,
    work_dir: Annotated[Path, typer.Option(help="Checkpoints and scratch space.")] = Path(
        "~/.corral/agent"
    ),
    models_dir: Annotated[
        Path | None, typer.Option(help="Model cache. [default: <work-dir>/models]")
    ] = None,
    models_budget: Annotated[
        str, typer.Option(help="Disk the model cache may use, e.g. 200GiB.")
    ] = "100GiB",
    shared_storage: Annotated[
        list[Path] | None,
        typer.Option(
            help="A directory every node sees (NFS, ...): checkpoints under it are reported "
            "by path instead of uploaded. Repeat for several.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the corral agent: take work from the server and run it on this machine.

    Without NVML (no NVIDIA driver) and without --fake-gpus the node offers
    CPU slots only and runs jobs with a demo executor.
    """
    from corral.agent.link import LinkRefused
    from corral.agent.main import AgentOptions, parse_labels
    from corral.core.errors import InvalidSpec
    from corral.core.pins import CertificateMismatch
    from corral.core.resources import parse_cpus, parse_memory

    setup_logging(log_level)
    if token and join:
        raise typer.BadParameter("give --token or --join, not both", param_hint="--join")
    try:
        options = AgentOptions(
            servers=tuple(u for item in server for u in item.split(",") if u.strip()),
            token=join or token or "",
            ca_fingerprint=ca_fingerprint,
            ca_cert=ca_cert,
            name=name,
            fake_gpus=fake_gpus,
            fake_topology=fake_topology,
            handler=handler,
            command=command,
            preload=tuple(m.strip() for it in preload or () for m in it.split(",") if m.strip()),
            a1111=a1111,
            comfyui=comfyui,
            a1111_models=a1111_models,
            comfyui_models=comfyui_models,
            labels=parse_labels(labels or []),
            cpus=None if cpus is None else parse_cpus(cpus, field_name="--cpus"),
            memory=None if memory is None else parse_memory(memory, field_name="--memory"),
            memory_reserve=None
            if memory_reserve is None
            else parse_memory(memory_reserve, field_name="--memory-reserve"),
            address=address,
            work_dir=work_dir,
            models_dir=models_dir,
            models_budget=models_budget,
            shared_storage=tuple(shared_storage or ()),
        )
        event_loop.run(_run(options))
    except InvalidSpec as exc:
        typer.echo(f"corral agent: {exc}", err=True)
        raise typer.Exit(2) from None
    except LinkRefused as exc:
        typer.echo(f"corral agent: the server refused this agent: {exc}", err=True)
        raise typer.Exit(3) from None
    except CertificateMismatch as exc:
        typer.echo(f"corral agent: {exc}", err=True)
        raise typer.Exit(3) from None


async def _run(options: AgentOptions) -> None:
    from corral.agent.main import Agent, run_agent

    agent = Agent(options)
    print(
        f"corral agent {agent.node}: backends {', '.join(agent.identity.backends)}; "
        f"dialling {', '.join(str(t) for t in agent.link.targets)}",
        flush=True,
    )
    event_loop.settle_heap()  # what the agent built to start lives as long as it does
    await run_agent(options, agent)


def setup_logging(level: str) -> None:
    if level not in ("debug", "info", "warning", "error"):
        raise typer.BadParameter("debug, info, warning or error", param_hint="--log-level")
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("grpc").setLevel(logging.WARNING)
