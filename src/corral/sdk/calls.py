"""Every API request as data: method, path, query, body and how to read the answer.

``Client`` and ``AsyncClient`` run the same ``Call`` objects, one with
``httpx.Client`` and one with ``httpx.AsyncClient``, so the two clients
cannot drift apart. Nothing here does I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from pydantic import TypeAdapter, ValidationError

from corral.sdk.errors import BadRequest
from corral.sdk.models import (
    AuditPage,
    AutoscalerStatus,
    Delivery,
    JobPage,
    JobSpec,
    JobStatus,
    NewToken,
    NodeStatus,
    PolicyStatus,
    PolicyVersion,
    QueueStatus,
    ResultStatus,
    TeamQuota,
    UsageReport,
)

T = TypeVar("T")
RESOURCE_FIELDS = frozenset({"gpus", "vram", "cpus", "gpu_models", "cpu_fallback", "memory"})
MAX_PAGE = 500  # the server's largest ?limit= on /v1/jobs


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and the function that turns its JSON answer into ``T``."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: list[tuple[str, str | int]] = field(default_factory=list)
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes | None = None  # a raw body instead of ``json`` (an input file)


def _model(kind: Any) -> Callable[[Any], Any]:
    adapter: TypeAdapter[Any] = TypeAdapter(kind)
    return adapter.validate_python


def _seg(value: str) -> str:
    """A path segment, escaped so an id can never change the path."""
    return quote(value, safe="")


def new_key() -> str:
    """A fresh idempotency key: a retried submit with the same key never makes a second job."""
    return f"sdk-{uuid.uuid4().hex}"


def make_spec(
    spec: JobSpec | Mapping[str, Any] | None, fields: Mapping[str, Any], prefix: str = ""
) -> JobSpec:
    """A ``JobSpec`` from a spec or a mapping plus keyword fields.

    ``gpus``, ``vram``, ``cpus``, ``memory``, ``gpu_models`` and ``cpu_fallback`` may be
    given at the top level as a shortcut for ``resources={...}``. Unknown or
    mistyped fields raise ``BadRequest`` naming the field (after ``prefix``,
    e.g. ``jobs[3].``).
    """
    if spec is not None and not isinstance(spec, JobSpec | Mapping):
        where = prefix.rstrip(".") or "spec"
        message = f"a job is a JobSpec or a mapping, not {type(spec).__name__}"
        raise BadRequest(422, "invalid", f"{where}: {message}", field=where)
    base = spec.body() if isinstance(spec, JobSpec) else dict(spec or {})
    merged = {**base, **fields}
    shortcuts = {k: merged.pop(k) for k in list(merged) if k in RESOURCE_FIELDS}
    if shortcuts:
        merged["resources"] = {**dict(merged.get("resources") or {}), **shortcuts}
    try:
        return JobSpec.model_validate(merged)
    except ValidationError as exc:
        raise invalid(exc, prefix) from None


def invalid(exc: ValidationError, prefix: str = "") -> BadRequest:
    """A local ``BadRequest`` in the server's shape, naming every wrong field."""
    fields = [
        {"field": prefix + ".".join(str(p) for p in e["loc"]), "message": e["msg"]}
        for e in exc.errors()
    ]
    message = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
    return BadRequest(422, "invalid", message, field=fields[0]["field"], fields=fields)


def submit(spec: JobSpec, key: str) -> Call[JobStatus]:
    return Call("POST", "/v1/jobs", _model(JobStatus), json=spec.body(), headers=_key(key))


def submit_batch(specs: Iterable[JobSpec], key: str) -> Call[list[JobStatus]]:
    body = {"jobs": [s.body() for s in specs]}
    return Call("POST", "/v1/jobs/batch", _jobs, json=body, headers=_key(key))


def _jobs(body: Any) -> list[JobStatus]:
    return [JobStatus.model_validate(j) for j in body["jobs"]]


def _key(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def get_job(job_id: str) -> Call[JobStatus]:
    return Call("GET", f"/v1/jobs/{_seg(job_id)}", _model(JobStatus))


def list_jobs(
    *,
    states: Iterable[str] = (),
    team: str | None = None,
    user: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Call[JobPage]:
    params: list[tuple[str, str | int]] = [("state", s) for s in states]
    params += [(k, v) for k, v in (("team", team), ("user", user), ("cursor", cursor)) if v]
    params.append(("limit", max(1, min(limit, MAX_PAGE))))
    return Call("GET", "/v1/jobs", _model(JobPage), params=params)


def result(job_id: str) -> Call[ResultStatus]:
    return Call("GET", f"/v1/jobs/{_seg(job_id)}/result", _model(ResultStatus))


def stop(job_id: str, how: str) -> Call[JobStatus]:
    """``how`` is ``cancel`` or ``interrupt``."""
    return Call("POST", f"/v1/jobs/{_seg(job_id)}/{how}", _model(JobStatus))


def edit_job(job_id: str, change: Mapping[str, Any]) -> Call[JobStatus]:
    """Change a queued job (``PATCH``): priority, timeout_s, labels, hold, top, user_weight."""
    return Call("PATCH", f"/v1/jobs/{_seg(job_id)}", _model(JobStatus), json=dict(change))


def edits(
    priority: str | None, timeout_s: float | None, labels: Mapping[str, str] | None,
    hold: bool | None, top: bool, user_weight: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A PATCH body of the changes given (None: unchanged)."""
    body: dict[str, Any] = {
        "priority": priority, "timeout_s": timeout_s, "hold": hold, "user_weight": user_weight,
    }  # fmt: skip
    body = {k: v for k, v in body.items() if v is not None}
    if labels is not None:
        body["labels"] = dict(labels)
    if top:
        body["top"] = True
    return body


def deliveries(job_id: str, limit: int = 100) -> Call[list[Delivery]]:
    path = f"/v1/jobs/{_seg(job_id)}/deliveries"
    return Call("GET", path, _deliveries, params=[("limit", limit)])


def _deliveries(body: Any) -> list[Delivery]:
    return [Delivery.model_validate(d) for d in body["deliveries"]]


def webhook_secret(team: str | None, rotate: bool = False) -> Call[str]:
    """The team's webhook signing secret (``rotate``: a new one)."""
    path = "/v1/webhooks/secret/rotate" if rotate else "/v1/webhooks/secret"
    params: list[tuple[str, str | int]] = [("team", team)] if team else []
    return Call("POST" if rotate else "GET", path, lambda b: str(b["secret"]), params=params)


def delete_job(job_id: str) -> Call[None]:
    """Delete a finished job with its events, results and previews (409 while it runs)."""
    return Call("DELETE", f"/v1/jobs/{_seg(job_id)}", lambda _: None)


def events_path(job_id: str) -> str:
    return f"/v1/jobs/{_seg(job_id)}/events"


def list_nodes() -> Call[list[NodeStatus]]:
    return Call("GET", "/v1/nodes", _model(list[NodeStatus]))


def get_node(name: str) -> Call[NodeStatus]:
    return Call("GET", f"/v1/nodes/{_seg(name)}", _model(NodeStatus))


def delete_node(name: str) -> Call[None]:
    """Forget a node that is gone (admin; 409 unless it is lost)."""
    return Call("DELETE", f"/v1/nodes/{_seg(name)}", lambda _: None)


def node_action(name: str, action: str) -> Call[NodeStatus]:
    """``action`` is ``pause``, ``resume`` or ``drain``."""
    return Call("POST", f"/v1/nodes/{_seg(name)}/{action}", _model(NodeStatus))


def list_teams() -> Call[list[TeamQuota]]:
    return Call("GET", "/v1/teams", _model(list[TeamQuota]))


def put_team(team: TeamQuota) -> Call[TeamQuota]:
    body = team.model_dump(mode="json", exclude={"name"})
    return Call("PUT", f"/v1/teams/{_seg(team.name)}", _model(TeamQuota), json=body)


def autoscaler() -> Call[AutoscalerStatus]:
    return Call("GET", "/v1/autoscaler", _model(AutoscalerStatus))


def queue(limit: int = 100) -> Call[QueueStatus]:
    return Call("GET", "/v1/queue", _model(QueueStatus), params=[("limit", limit)])


def create_token(kind: str, name: str, team: str | None) -> Call[NewToken]:
    body = {"kind": kind, "name": name, "team": team}
    return Call("POST", "/v1/tokens", _model(NewToken), json=body)


def audit(
    *,
    actor: str | None = None,
    team: str | None = None,
    actions: Iterable[str] = (),
    target: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Call[AuditPage]:
    """A page of the audit log, newest first (admin); ``job.*`` in ``actions`` matches
    every job action."""
    params: list[tuple[str, str | int]] = [("action", a) for a in actions]
    texts = (("actor", actor), ("team", team), ("target", target), ("cursor", cursor))
    params += [(k, v) for k, v in texts if v]
    params += [
        (k, repr(float(v))) for k, v in (("since", since), ("until", until)) if v is not None
    ]
    params.append(("limit", max(1, min(limit, MAX_PAGE))))
    return Call("GET", "/v1/audit", _model(AuditPage), params=params)


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/healthz", _model(dict[str, Any]))


class Unchanged:
    """The type of ``UNCHANGED``: "keep the current value" (``None`` means "no limit")."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()


def merge_team(
    name: str,
    current: TeamQuota | None,
    quota: float | None,
    borrow_limit: float | Unchanged | None,
    weight: float | None,
) -> TeamQuota:
    """The team to PUT: the given settings over the current ones (or the defaults)."""
    base = current or TeamQuota(name=name)
    return TeamQuota(
        name=name,
        quota_gpus=base.quota_gpus if quota is None else quota,
        borrow_limit_gpus=(
            base.borrow_limit_gpus if isinstance(borrow_limit, Unchanged) else borrow_limit
        ),
        weight=base.weight if weight is None else weight,
    )


def get_policy() -> Call[PolicyStatus]:
    return Call("GET", "/v1/policy", _model(PolicyStatus))


def put_policy(document: str, note: str = "") -> Call[PolicyStatus]:
    body = {"document": document, "note": note}
    return Call("PUT", "/v1/policy", _model(PolicyStatus), json=body)


def check_policy(document: str) -> Call[dict[str, Any]]:
    return Call("POST", "/v1/policy/check", _model(dict[str, Any]), json={"document": document})


def policy_history(limit: int = 50) -> Call[list[PolicyVersion]]:
    return Call("GET", "/v1/policy/history", _model(list[PolicyVersion]), params=[("limit", limit)])


def rollback_policy(version: int) -> Call[PolicyStatus]:
    return Call("POST", "/v1/policy/rollback", _model(PolicyStatus), json={"version": version})


def usage(
    by: Iterable[str] = ("team",), since: float | None = None, until: float | None = None
) -> Call[UsageReport]:
    params: list[tuple[str, str | int]] = [("by", ",".join(by))]
    if since is not None:
        params.append(("from", repr(since)))
    if until is not None:
        params.append(("to", repr(until)))
    return Call("GET", "/v1/usage", _model(UsageReport), params=params)
