"""Routes served by hand-gathered arguments, before routing (api/direct.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request, Response

from corral.core.errors import Forbidden
from corral.server.api import errors
from corral.server.api.direct import HotRoutes, gathered_by

pytestmark = pytest.mark.anyio


async def echo(word: str) -> Response:
    return Response(word.upper(), media_type="text/plain")


async def _echo_args(request: Request) -> dict[str, Any]:
    word = request.query_params.get("word", "")
    if word == "secret":
        raise Forbidden("that word is not for you")
    return {"word": word}


def app_with_hot_route(*, routed: bool) -> FastAPI:
    router = APIRouter()
    router.add_api_route(
        "/echo", echo, methods=["POST"], route_class_override=gathered_by(_echo_args)
    )
    app = FastAPI()
    errors.install(app)
    if routed:
        app.include_router(router)
    app.add_middleware(HotRoutes, routes=router.routes)
    return app


async def test_a_hot_route_is_served_before_routing_with_the_app_s_error_handlers() -> None:
    app = app_with_hot_route(routed=False)  # the router never sees it: only the lane can serve
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        ok = await c.post("/echo", params={"word": "hi"})
        assert (ok.status_code, ok.text) == (200, "HI")
        refused = await c.post("/echo", params={"word": "secret"})
        assert refused.status_code == 403  # corral's handler, as through the router
        assert refused.json() == {"error": "forbidden", "message": "that word is not for you"}
        assert (await c.get("/echo")).status_code == 404  # another method: routed as usual
        assert (await c.post("/echo/")).status_code == 404  # only the exact path is hot


async def test_the_declared_endpoint_still_documents_the_route() -> None:
    app = app_with_hot_route(routed=True)
    params = app.openapi()["paths"]["/echo"]["post"]["parameters"]
    assert [p["name"] for p in params] == ["word"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        assert (await c.post("/echo", params={"word": "yo"})).text == "YO"
