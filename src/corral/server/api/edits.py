"""The JSON shapes of the editable queue and of webhooks (``PATCH /v1/jobs/{id}``,
``/v1/jobs/{id}/deliveries``, ``/v1/webhooks/secret``)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from corral.server.api.schemas import MAX_LABELS, MAX_TIMEOUT_S, ApiModel, Label, Name
from corral.server.services.queue_edits import JobEdit


class JobPatchIn(ApiModel):
    """What to change in a queued job; fields left out stay as they are."""

    priority: Name | None = Field(None, description="a priority class the token may use")
    timeout_s: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False, description="its time limit"
    )
    labels: dict[Label, Label] | None = Field(
        None, max_length=MAX_LABELS, description="replaces its labels ({} clears them)"
    )
    hold: bool | None = Field(
        None, description="true: hold (stays queued, never placed); false: release"
    )
    top: bool = Field(False, description="move it to the top of its user's own queue")
    user_weight: float | None = Field(
        None,
        gt=0,
        le=1000,
        allow_inf_nan=False,
        description="its user's weight (admin): a user's share among the team's users, set "
        "in the policy as a new version (users.<name>.weight); every job of the user has it",
    )

    def to_edit(self) -> JobEdit:
        return JobEdit(self.priority, self.timeout_s, self.labels, self.hold, self.top)


class AttemptRecordOut(BaseModel):
    at: float
    status: int | None
    error: str | None
    ms: float


class DeliveryOut(BaseModel):
    """One webhook call to make, and how its attempts went."""

    id: str = Field(description="sent as Corral-Delivery on every attempt")
    subject: str = Field(description="the job, pipeline or array it reports on")
    subject_kind: str = Field(description="job, pipeline or array")
    kind: str = Field(description="the event reported, e.g. job.succeeded (Corral-Event)")
    event_seq: int
    url: str
    state: str = Field(description="pending, delivered or failed (retries over, or refused)")
    attempts: int
    created_at: float
    next_at: float | None = Field(description="when the next attempt is due (pending)")
    delivered_at: float | None
    last_status: int | None = Field(description="the receiver's last HTTP status")
    last_error: str | None
    history: list[AttemptRecordOut] = Field(description="the latest attempts, oldest first")
    body: dict[str, Any] = Field(description="the JSON sent, as signed")


class DeliveriesOut(BaseModel):
    deliveries: list[DeliveryOut]


class SecretOut(BaseModel):
    team: str
    secret: str = Field(description="signs every webhook call of the team (HMAC-SHA256)")


def delivery_out(row: Any) -> DeliveryOut:
    return DeliveryOut(
        id=row.id,
        subject=row.subject,
        subject_kind=row.subject_kind,
        kind=row.kind,
        event_seq=row.event_seq,
        url=row.url,
        state=row.state,
        attempts=row.attempts,
        created_at=row.created_at,
        next_at=row.next_at if row.state == "pending" else None,
        delivered_at=row.delivered_at,
        last_status=row.last_status,
        last_error=row.last_error,
        history=[AttemptRecordOut(**h) for h in row.history or ()],
        body=json.loads(row.body),
    )
