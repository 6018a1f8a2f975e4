"""ComfyUI's own web frontend, served by corral at ``/comfyui/`` (opt-in).

ComfyUI ships its frontend as the PyPI package ``comfyui-frontend-package``
(static files) and serves that directory at ``/`` (its
``app/frontend_management.py`` finds the package's ``static`` folder). corral
serves the same folder at ``/comfyui/`` when the package is installed and
``compat.comfyui_frontend`` is on, never from a CDN. Off by default: the page is
third-party code on the dashboard's origin.

The frontend calls the API relative to its page (``/comfyui/api/...``, the socket
at ``/comfyui/ws``), so the ComfyUI routes are mounted there too. It also calls
routes a ComfyUI server has for its own users and extensions (settings, user
data, custom-node translations and templates, feature flags). corral has none
of those, so they get the empty answers a fresh ComfyUI with no custom nodes
gives (``STUBS``): the page loads, lists the cluster's node types, and queues
graphs; settings changed in the page are not kept. Those routes need the same
credentials as the rest (the browser asks once, HTTP Basic, any user name and a
corral token as the password).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

from corral.server.api.compat_auth import compat_caller, shaped_route
from corral.server.api.compat_comfyui import render
from corral.server.services.compat import Caller

PAGE = "/comfyui"
HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}

STUBS: dict[tuple[str, str], Callable[[], Any]] = {
    # ComfyUI's user manager with one user (no --multi-user): settings and user files
    ("GET", "/users"): lambda: {"storage": "server", "migrated": True},
    # corral lists no workflow templates: the first-run template browser is skipped
    ("GET", "/settings"): lambda: {"Comfy.TutorialCompleted": True},
    ("GET", "/settings/{setting_id}"): lambda: None,
    ("POST", "/settings"): lambda: None,
    ("POST", "/settings/{setting_id}"): lambda: None,
    ("GET", "/userdata"): list,
    # what custom nodes add: translations, workflow templates, subgraph blueprints
    ("GET", "/i18n"): dict,
    ("GET", "/workflow_templates"): dict,
    ("GET", "/global_subgraphs"): dict,
    ("GET", "/node_replacements"): dict,
    ("GET", "/experiment/models"): list,
    ("GET", "/experiment/models/{folder}"): list,
    ("GET", "/features"): dict,
}
"""Routes of a ComfyUI server that corral answers empty: (method, path) -> the body."""


def static_dir() -> Path | None:
    """The installed frontend's ``static`` folder, or None (as ComfyUI's frontend
    manager finds it: the ``comfyui_frontend_package`` module's ``static``)."""
    spec = importlib.util.find_spec("comfyui_frontend_package")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(next(iter(spec.submodule_search_locations))) / "static"
    return found if (found / "index.html").is_file() else None


def stub_router() -> APIRouter:
    """The empty answers, each behind the drop-in API's credentials."""
    router = APIRouter(route_class=shaped_route(render), include_in_schema=False)
    for (method, path), body in STUBS.items():
        router.add_api_route(path, _answer(body), methods=[method])
    return router


def _answer(body: Callable[[], Any]) -> Callable[..., Any]:
    async def answer(who: Annotated[Caller, Depends(compat_caller)]) -> Response:
        value = body()
        return Response(status_code=200) if value is None else JSONResponse(value)

    return answer


def extensions(root: Path) -> list[str]:
    """``/extensions``: the frontend's own extension scripts, as ComfyUI lists its web
    root's ``extensions/**/*.js`` (corral serves no custom nodes' scripts)."""
    return sorted("/" + p.relative_to(root).as_posix() for p in root.glob("extensions/**/*.js"))


def install(app: FastAPI, root: Path, api_routers: list[APIRouter]) -> None:
    """Serve the frontend in ``root`` at ``/comfyui/``, its API under ``/comfyui/api``."""
    listed = extensions(root)

    async def extension_list(who: Annotated[Caller, Depends(compat_caller)]) -> list[str]:
        return listed

    stubs = stub_router()
    stubs.add_api_route("/extensions", extension_list, methods=["GET"])
    for prefix in ("/api", f"{PAGE}/api"):
        app.include_router(stubs, prefix=prefix)
    for router in api_routers:
        app.include_router(router, prefix=f"{PAGE}/api")
        app.include_router(router, prefix=PAGE)  # its socket: /comfyui/ws

    @app.get(PAGE, include_in_schema=False)
    async def page(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{PAGE}/")  # the page finds its API relative to its path

    app.mount(PAGE, FrontendFiles(directory=root, html=True), name="comfyui-frontend")


class FrontendFiles(StaticFiles):
    """The frontend's files, which may not be framed by another site."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        if path in ("", ".", "index.html"):
            response.headers["Cache-Control"] = "no-cache"  # as ComfyUI serves its page
        return response
