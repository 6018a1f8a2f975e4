"""Settings of the AUTOMATIC1111- and ComfyUI-compatible APIs (``CORRAL_COMPAT__*``).

A request through these APIs becomes a corral job; these say what that job
asks for. The webui and ComfyUI each drive one GPU, so a request takes one
whole card where the backend has one; where every node offering the backend
is CPU-only it takes CPU slots (``cpus``: what one generation should occupy).
That is the default (``gpus`` unset): a request goes where the backend is,
GPU or not. ``gpus: 0`` asks for CPU slots always, ``gpus: 1`` a GPU always.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class CompatSettings(BaseModel):
    """The drop-in APIs (docs/compat.md)."""

    enabled: bool = Field(default=True, description="serve /sdapi/v1/* and the ComfyUI API")
    gpus: float | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="GPUs one request takes (0: CPU slots only; unset: one GPU where the "
        "backend's nodes have GPUs, CPU slots where they are all CPU-only)",
    )
    comfyui_frontend: bool = Field(
        default=False,
        description="serve ComfyUI's web frontend at /comfyui/ (needs the comfyui-frontend-"
        "package, the comfyui-ui extra); off by default: it is third-party code on the "
        "dashboard's origin",
    )
    cpus: int = Field(default=1, ge=0, le=4096, description="CPU slots one request takes")
    priority: str = Field(
        default="free", description="priority class of requests (header X-Corral-Priority wins)"
    )
    team_priority: dict[str, str] = Field(
        default_factory=dict, description="priority class per team, e.g. {'pro': 'paid'}"
    )
    max_attempts: int = Field(default=3, ge=1, le=100, description="per request (failover)")
    catalog_ttl_s: float = Field(
        default=30.0, gt=0, description="how long a backend's lists (models, samplers) are reused"
    )
    catalog_timeout_s: float = Field(
        default=30.0, gt=0, description="how long to wait for a backend to list what it has"
    )
    options_max_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="largest POST /sdapi/v1/options body, and the most one caller's options "
        "may take kept (as JSON); the webui's whole options list is about 20 KB",
    )
    max_callers: int = Field(
        default=1000,
        ge=1,
        description="callers (token and user name) whose options and running requests are "
        "kept; past it the one unused longest is forgotten (its options go back to the "
        "defaults)",
    )
    caller_idle_s: float = Field(
        default=3600.0,
        gt=0,
        description="a caller unused this long (and with no request running) is forgotten",
    )
