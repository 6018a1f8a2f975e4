"""The web dashboard: static files served at ``/``, no build step.

The page (``server/web/``) uses only the public HTTP API with the token the
user logs in with, like any other client.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

WEB = Path(__file__).resolve().parent.parent / "web"


def install(app: FastAPI) -> None:
    """Serve the dashboard at ``/`` and its assets under ``/static``."""

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(WEB / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=WEB), name="static")
