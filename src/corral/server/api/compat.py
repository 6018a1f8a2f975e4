"""Mount the drop-in AUTOMATIC1111 and ComfyUI APIs on the app (docs/compat.md)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from corral.server.api import compat_a1111, compat_comfyui, compat_comfyui_cluster
from corral.server.plane import ControlPlane
from corral.server.services.compat import CompatJobs, compat_settings
from corral.server.services.compat_a1111 import A1111Service
from corral.server.services.compat_catalog import CatalogCache
from corral.server.services.compat_comfyui import ComfyService
from corral.server.services.compat_comfyui_cluster import ComfyCluster

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
    app.state.compat = CompatServices(
        jobs, catalogs, A1111Service(jobs, catalogs), comfyui, ComfyCluster(comfyui)
    )
    app.include_router(compat_a1111.router)
    # ComfyUI serves each route at its path and again under /api (which its own web
    # frontend calls); corral does the same
    for prefix in COMFYUI_PREFIXES:
        app.include_router(compat_comfyui.router, prefix=prefix)
        app.include_router(compat_comfyui_cluster.router, prefix=prefix)
