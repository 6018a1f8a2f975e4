"""``/v1/tokens``: the admin creates, lists and revokes team and agent tokens, and rotates
the admin token."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.api.render import NewTokenOut, TokenIn, TokenOut, token_out
from corral.server.services.auth import TokenKind
from corral.server.tls import join_for

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=ERRORS)


@router.post("", status_code=201, response_model=NewTokenOut)
async def create_token(body: TokenIn, plane: Plane, who: Caller, request: Request) -> NewTokenOut:
    """A new team token (sees and submits only its team's jobs) or agent join token.

    The secret is in the answer once; only its hash is stored. An agent token
    comes with its join string and command, the address named as the caller
    reached this API (docs/security/tls.md).
    """
    who.require_admin("create tokens")
    info, secret = await plane.auth.create(TokenKind(body.kind), body.name, body.team, by=who)
    out = NewTokenOut(**token_out(info).model_dump(), token=secret)
    if info.kind is TokenKind.AGENT:
        address = getattr(plane.link, "address", None)
        out.join, out.join_command = join_for(plane.tls, secret, address, request.url.hostname)
    return out


@router.get("", response_model=list[TokenOut])
async def list_tokens(plane: Plane, who: Caller) -> list[TokenOut]:
    who.require_admin("list tokens")
    return [token_out(t) for t in await plane.auth.listing()]


@router.post("/admin/rotate", status_code=201, response_model=NewTokenOut)
async def rotate_admin_token(plane: Plane, who: Caller) -> NewTokenOut:
    """A new admin token; every other admin token (the caller's too) is revoked at once.

    The secret is in the answer once. Refused (409) when the admin token is configured
    (``admin_token`` / ``CORRAL_ADMIN_TOKEN``): change the setting and restart instead.
    """
    info, secret = await plane.auth.rotate_admin(who)
    return NewTokenOut(**token_out(info).model_dump(), token=secret)


@router.delete("/{token_id}", status_code=204, response_class=Response)
async def revoke_token(token_id: str, plane: Plane, who: Caller) -> Response:
    """Revoke a token: it stops working at once, and every stream and agent connection it
    holds open ends within about a second on every replica (``api.revocation_check_s``)."""
    who.require_admin("revoke tokens")
    await plane.auth.revoke(token_id, by=who)
    return Response(status_code=204)
