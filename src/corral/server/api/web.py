"""The web dashboard: static files served at ``/``, no build step; Swagger UI at ``/docs``.

The page (``server/web/``) uses only the public HTTP API, like any other
client, authenticated by the session cookie its login sets (``session.py``):
no token is kept where a script could read it. The page and its files are
served with a strict Content-Security-Policy (scripts from this origin only,
no inline script), and may not be framed (``served_files.DASHBOARD_HEADERS``).

Swagger UI's files are vendored from the npm registry (``web/vendor/swagger-ui``,
with its licence) rather than loaded from a CDN: ``/docs`` works on a machine
with no internet access, and the page loads no code from a third party.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

from corral.server.api.served_files import DASHBOARD_HEADERS

WEB = Path(__file__).resolve().parent.parent / "web"
SWAGGER = "/static/vendor/swagger-ui"


def install(app: FastAPI) -> None:
    """Serve the dashboard at ``/``, its assets under ``/static``, Swagger UI at ``/docs``."""

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        headers = {"Cache-Control": "no-cache", **DASHBOARD_HEADERS}
        return FileResponse(WEB / "index.html", headers=headers)

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{SWAGGER}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER}/favicon-32x32.png",
        )

    app.mount("/static", DashboardFiles(directory=WEB), name="static")


class DashboardFiles(StaticFiles):
    """The dashboard's assets, with its security headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(DASHBOARD_HEADERS)
        return response
