"""The web dashboard: static files served at ``/``, no build step.

The page (``server/web/``) uses only the public HTTP API, like any other
client, authenticated by the session cookie its login sets (``session.py``):
no token is kept where a script could read it. The page and its files are
served with a strict Content-Security-Policy (scripts from this origin only,
no inline script), and may not be framed (``served_files.DASHBOARD_HEADERS``).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

from corral.server.api.served_files import DASHBOARD_HEADERS

WEB = Path(__file__).resolve().parent.parent / "web"


def install(app: FastAPI) -> None:
    """Serve the dashboard at ``/`` and its assets under ``/static``."""

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        headers = {"Cache-Control": "no-cache", **DASHBOARD_HEADERS}
        return FileResponse(WEB / "index.html", headers=headers)

    app.mount("/static", DashboardFiles(directory=WEB), name="static")


class DashboardFiles(StaticFiles):
    """The dashboard's assets, with its security headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(DASHBOARD_HEADERS)
        return response
