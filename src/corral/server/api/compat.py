"""Mount the drop-in AUTOMATIC1111 and ComfyUI APIs on the app (docs/compat.md)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastapi import FastAPI

from corral.server.agentlink.grpc_link import GrpcLink
from corral.server.api import (
    compat_a1111,
    compat_comfyui,
    compat_comfyui_cluster,
    compat_comfyui_frontend,
)
from corral.server.plane import ControlPlane
from corral.server.services.backend_info import BackendInfoStore
from corral.server.services.compat import CompatJobs, compat_settings
from corral.server.services.compat_a1111 import A1111Service
from corral.server.services.compat_catalog import CatalogCache
from corral.server.services.compat_comfyui import ComfyService
from corral.server.services.compat_comfyui_cluster import ComfyCluster

log = logging.getLogger("corral.server.compat")
COMFYUI_PREFIXES = ("", "/api")


@dataclass(frozen=True, slots=True)
class CompatServices:
    """The drop-in APIs' state, one per app (``app.state.compat``)."""

    jobs: CompatJobs
    catalogs: CatalogCache
    a1111: A1111Service
    comfyui: ComfyService
    comfyui_cluster: ComfyCluster


def install(app: FastAPI, plane: ControlPlane) -> None:
    """Serve ``/sdapi/v1/*`` and ComfyUI's API unless ``compat.enabled`` is off."""
    settings = compat_settings(plane.rt.settings)
    if not settings.enabled:
        return
    jobs = CompatJobs(plane, settings)
    catalogs = CatalogCache(jobs)
    comfyui = ComfyService(jobs, catalogs)
    described = BackendInfoStore(plane.rt.blobs, plane.rt.clock)
    if isinstance(plane.link, GrpcLink):  # agents' reports of their ComfyUI's object_info
        plane.link.on_backend_info = described.record
    app.state.compat = CompatServices(
        jobs, catalogs, A1111Service(jobs, catalogs), comfyui, ComfyCluster(comfyui, described)
    )
    app.include_router(compat_a1111.router)
    # ComfyUI serves each route at its path and again under /api (which its own web
    # frontend calls); corral does the same
    routers = [compat_comfyui.router, compat_comfyui_cluster.router]
    for prefix in COMFYUI_PREFIXES:
        for router in routers:
            app.include_router(router, prefix=prefix)
    frontend = compat_comfyui_frontend.static_dir() if settings.comfyui_frontend else None
    if frontend is not None:
        compat_comfyui_frontend.install(app, frontend, routers)
    elif settings.comfyui_frontend:
        log.warning(
            "compat.comfyui_frontend is on but comfyui-frontend-package is not installed "
            "(pip install 'corral[comfyui-ui]'); /comfyui/ is not served"
        )
