"""The composition root: settings in, a running FastAPI app out.

This is the only place that picks the real implementations of the seams
(wall clock, local blob directory, the database from ``--db``, the agent
link, the scheduler). Tests pass their own (a stub link, a virtual clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI

from corral import __version__
from corral.core.clock import Clock, WallClock
from corral.server import tls
from corral.server.agentlink.base import AgentLink
from corral.server.agentlink.grpc_link import GrpcLink
from corral.server.agentlink.inprocess import InProcessLink
from corral.server.api import (
    audit,
    autoscaler,
    compat,
    errors,
    events,
    health,
    inputs,
    jobs,
    nodes,
    pipelines,
    policy,
    session,
    tokens,
    usage,
    web,
    webhooks,
)
from corral.server.api import history as history_api
from corral.server.api import models as model_api
from corral.server.api.direct import HotRoutes
from corral.server.api.limits import BodyLimit, upload_limits
from corral.server.autoscaling import scaling_from
from corral.server.blobs import BlobStore, LocalBlobStore
from corral.server.permissions import make_private
from corral.server.plane import ControlPlane, StartReport
from corral.server.policy_doc import default_policy
from corral.server.services.history import History
from corral.server.services.metrics import Metrics
from corral.server.services.unit import Runtime
from corral.server.settings import Settings
from corral.server.store.db import Database, parse_db

log = logging.getLogger("corral.server")

DESCRIPTION = """
The corral control plane. Submit jobs, follow them (Server-Sent Events), fetch
their results; see nodes, teams and the queue with the scheduler's reasons.

Authenticate with `Authorization: Bearer <token>`: the admin token (printed at
the first start), or a team token the admin created (`POST /v1/tokens`).
Errors are `{"error": code, "message": text, "field": name}`.
"""


def build_runtime(
    settings: Settings,
    *,
    link: AgentLink | None = None,
    clock: Clock | None = None,
    blobs: BlobStore | None = None,
) -> Runtime:
    """The shared runtime with real implementations for every seam not given.

    The state folders and the SQLite file are made private first (or tightened), before
    anything is written to them (``permissions.make_private``)."""
    make_private(settings)
    target = parse_db(settings.db_url())
    db = Database(
        target,
        sqlite_synchronous=settings.store.sqlite_synchronous,
        pool_size=settings.store.pool_size,
        pool_timeout_s=settings.store.pool_timeout_s,
        wal_prefill=settings.store.sqlite_wal_prefill,
    )
    return Runtime(
        settings=settings,
        db=db,
        blobs=blobs or LocalBlobStore(settings.blob_path()),
        clock=clock or WallClock(),
        link=link or default_link(settings),
        metrics=Metrics(),
        policy=default_policy(),  # until the store's latest is read (services/policy.py)
    )


def default_link(settings: Settings) -> AgentLink:
    """The gRPC agent link (started with the app), or the in-process stub when it is off."""
    if settings.agents.enabled:
        return GrpcLink(settings.agents, settings.api.host)
    return InProcessLink()


def create_plane(
    settings: Settings,
    *,
    link: AgentLink | None = None,
    clock: Clock | None = None,
    blobs: BlobStore | None = None,
    run_loops: bool = True,
) -> ControlPlane:
    chosen_tls = tls.apply(settings)  # before the link is built: it serves the same certificate
    rt = build_runtime(settings, link=link, clock=clock, blobs=blobs)
    scaling = scaling_from(settings)  # docs/autoscaler.md; None when off
    plane = ControlPlane(rt, run_loops=run_loops, scaling=scaling)
    plane.tls = chosen_tls
    if plane.autoscale is not None and chosen_tls is not None:
        plane.autoscale.join_token = lambda token: str(chosen_tls.join(token))
    return plane


def create_app(
    settings: Settings | None = None,
    *,
    plane: ControlPlane | None = None,
    on_started: Callable[[StartReport], None] | None = None,
) -> FastAPI:
    """The HTTP app. Starting it (its lifespan) migrates the store and starts the loops."""
    plane = plane or create_plane(settings or Settings())

    kept = History(plane.rt)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        report = await plane.start()
        sampling = asyncio.create_task(kept.run(), name="corral-history")
        try:
            if isinstance(plane.link, GrpcLink):  # agents may dial in once the store is ready
                rt = plane.rt
                await plane.link.start(plane.agents, rt.blobs, rt.clock, rt.metrics.registry)
            if on_started is not None:
                on_started(report)
            yield
        finally:
            sampling.cancel()
            if isinstance(plane.link, GrpcLink):
                await plane.link.close()
            await plane.stop()

    app = FastAPI(
        title="corral",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from the package by web.install: works offline
        openapi_url="/openapi.json",
        **_without_telemetry(),
    )
    app.state.plane = plane
    errors.install(app, refused=audit.refusals(plane))
    routers = (
        jobs,
        pipelines,
        webhooks,
        inputs,
        nodes,
        autoscaler,
        tokens,
        audit,
        events,
        health,
        session,
        policy,
        usage,
    )
    for module in routers:
        app.include_router(module.router)
    model_api.install(app, plane)
    history_api.install(app, kept)  # the dashboard's plots
    compat.install(app, plane)  # /sdapi/v1/* and ComfyUI's API (docs/compat.md)
    web.install(app)
    app.add_middleware(HotRoutes, routes=jobs.router.routes)  # inside BodyLimit: limits apply
    app.add_middleware(
        BodyLimit,
        max_bytes=plane.rt.settings.api.max_body_bytes,
        larger=upload_limits(plane.rt.settings.inputs.max_bytes),
    )
    return app


def _without_telemetry() -> dict[str, Any]:
    """FastAPI's built-in OpenTelemetry hooks, off: corral exports Prometheus metrics, and the
    hooks ask the global providers (and the environment) on every request.
    """
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}  # a FastAPI without them
    off = ("tracing", "metrics", "logs", "operation_spans")
    return {"telemetry": dict.fromkeys(off, False)}
