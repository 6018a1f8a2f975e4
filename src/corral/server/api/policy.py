"""``/v1/policy``: the admin reads, checks, applies and rolls back the policy (docs/server.md).

A policy applied here is in force from the next scheduling cycle on every
replica; every version is kept with who applied it and when.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.policy_doc import MAX_BYTES, Policy, describe, parse
from corral.server.services.policy import HISTORY_MAX
from corral.server.store.policies import PolicyVersion

router = APIRouter(prefix="/v1/policy", tags=["policy"], responses=ERRORS)


class PolicyIn(BaseModel):
    document: str = Field(max_length=MAX_BYTES, description="the policy document (YAML)")
    note: str = Field("", max_length=512, description="why: kept in the history")


MAX_VERSION = 2**31 - 1  # versions are 32-bit integers on both databases


class RollbackIn(BaseModel):
    version: int = Field(ge=0, le=MAX_VERSION, description="the version to apply again")


class VersionOut(BaseModel):
    version: int = Field(description="0: the built-in policy, none applied yet")
    applied_by: str
    applied_at: float
    note: str


class PolicyOut(VersionOut):
    document: str
    policy: dict[str, Any] = Field(description="the document as the server reads it")


class CheckOut(BaseModel):
    ok: bool
    policy: dict[str, Any]


@router.get("", response_model=PolicyOut)
async def get_policy(plane: Plane, who: Caller) -> PolicyOut:
    """The policy in force: its document, version, who applied it and when."""
    who.require_admin("read the policy")
    entry, policy = await plane.policy.show()
    return _out(entry, policy)


@router.put("", response_model=PolicyOut)
async def put_policy(body: PolicyIn, plane: Plane, who: Caller) -> PolicyOut:
    """Apply a policy document as the next version (422 naming line and field if wrong)."""
    entry = await plane.policy.apply(who, body.document, body.note)
    return _out(entry, plane.policy.current)


@router.post("/check", response_model=CheckOut)
async def check_policy(body: PolicyIn, who: Caller) -> CheckOut:
    """Check a document without applying it: 422 naming line and field, or how it reads."""
    who.require_admin("check a policy")
    return CheckOut(ok=True, policy=describe(parse(body.document)))


@router.get("/history", response_model=list[VersionOut])
async def policy_history(
    plane: Plane, who: Caller, limit: int = Query(50, ge=1, le=HISTORY_MAX)
) -> list[VersionOut]:
    """The versions applied, newest first (documents: ``GET /v1/policy/versions/{n}``)."""
    entries = await plane.policy.history(who, limit)
    return [VersionOut(**_version(e)) for e in entries]


@router.get("/versions/{version}", response_model=PolicyOut)
async def policy_version(
    version: Annotated[int, Path(ge=0, le=MAX_VERSION)], plane: Plane, who: Caller
) -> PolicyOut:
    entry = await plane.policy.version(who, version)
    return _out(entry, parse(entry.document))


@router.post("/rollback", response_model=PolicyOut)
async def rollback_policy(body: RollbackIn, plane: Plane, who: Caller) -> PolicyOut:
    """Apply an earlier version's document again, as a new version."""
    entry = await plane.policy.rollback(who, body.version)
    return _out(entry, plane.policy.current)


def _out(entry: PolicyVersion, policy: Policy) -> PolicyOut:
    return PolicyOut(**_version(entry), document=entry.document, policy=describe(policy))


def _version(entry: PolicyVersion) -> dict[str, Any]:
    return {
        "version": entry.version,
        "applied_by": entry.applied_by,
        "applied_at": entry.applied_at,
        "note": entry.note,
    }
