"""``/v1/tokens``: the admin creates, lists and revokes team and agent tokens."""

from __future__ import annotations

from fastapi import APIRouter, Response

from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.api.render import NewTokenOut, TokenIn, TokenOut, token_out
from corral.server.services.auth import TokenKind

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=ERRORS)


@router.post("", status_code=201, response_model=NewTokenOut)
async def create_token(body: TokenIn, plane: Plane, who: Caller) -> NewTokenOut:
    """A new team token (sees and submits only its team's jobs) or agent join token.

    The secret is in the answer once; only its hash is stored.
    """
    who.require_admin("create tokens")
    info, secret = await plane.auth.create(TokenKind(body.kind), body.name, body.team, by=who)
    return NewTokenOut(**token_out(info).model_dump(), token=secret)


@router.get("", response_model=list[TokenOut])
async def list_tokens(plane: Plane, who: Caller) -> list[TokenOut]:
    who.require_admin("list tokens")
    return [token_out(t) for t in await plane.auth.listing()]


@router.delete("/{token_id}", status_code=204, response_class=Response)
async def revoke_token(token_id: str, plane: Plane, who: Caller) -> Response:
    """Revoke a token: it stops working within ``api.token_cache_s`` on every replica."""
    who.require_admin("revoke tokens")
    await plane.auth.revoke(token_id, by=who)
    return Response(status_code=204)
