"""``queue_waits``: what the scheduling leader last said of waiting and running jobs.

The leader replaces the rows whole (``replace``); other replicas read them whole
(``read``) to rank the queue and explain it as the leader would (``loops/waits.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.scheduler.api import Reason, ReasonCode, Remedy, Unplaced
from corral.scheduler.eta import Eta
from corral.server.store.tables import queue_waits


@dataclass(frozen=True, slots=True)
class Said:
    """What the leader said, as read back: the unplaced jobs and the ETAs, made when."""

    unplaced: Mapping[str, Unplaced]
    etas: Mapping[str, Eta]
    made_at: float

    def eta(self, job_id: str) -> tuple[Eta, float] | None:
        """``job_id``'s ETA and when it was made (None: none)."""
        eta = self.etas.get(job_id)
        return None if eta is None else (eta, self.made_at)


Row = dict[str, object]


def rows(unplaced: Iterable[Unplaced], etas: Mapping[str, Eta], made_at: float) -> list[Row]:
    """The rows that say these: one per job, its place and reasons, its ETA, or both."""
    by_job: dict[str, Row] = {}
    for u in unplaced:
        by_job[u.job_id] = _empty(u.job_id, made_at) | {
            "position": u.position,
            "reasons": json.dumps([[r.code.value, r.nodes, r.message] for r in u.reasons]),
            "remedy": u.remedy.value,
        }
    for job_id, eta in etas.items():
        by_job.setdefault(job_id, _empty(job_id, made_at)).update(
            eta_start=eta.start_at,
            eta_end=eta.end_at,
            eta_runtime_s=eta.runtime_s,
            eta_basis=eta.basis,
        )
    return list(by_job.values())


async def replace(conn: AsyncConnection, new: list[Row]) -> None:
    """Put ``new`` (from ``rows``) in place of every row."""
    await conn.execute(queue_waits.delete())
    if new:
        await conn.execute(queue_waits.insert(), new)


async def read(conn: AsyncConnection) -> Said:
    """Every row, as the leader wrote them."""
    unplaced: dict[str, Unplaced] = {}
    etas: dict[str, Eta] = {}
    made_at = 0.0
    for row in await conn.execute(sa.select(queue_waits)):
        m = row._mapping
        job_id = str(m["job_id"])
        made_at = max(made_at, float(m["made_at"]))
        if m["position"] is not None:
            reasons = tuple(
                Reason(ReasonCode(code), int(nodes), str(message))
                for code, nodes, message in json.loads(m["reasons"] or "[]")
            )
            unplaced[job_id] = Unplaced(job_id, int(m["position"]), reasons, Remedy(m["remedy"]))
        if m["eta_runtime_s"] is not None:
            etas[job_id] = Eta(
                job_id,
                m["eta_start"],
                m["eta_end"],
                float(m["eta_runtime_s"]),
                str(m["eta_basis"]),
            )
    return Said(unplaced, etas, made_at)


def _empty(job_id: str, made_at: float) -> Row:
    return {
        "job_id": job_id,
        "position": None,
        "reasons": None,
        "remedy": None,
        "eta_start": None,
        "eta_end": None,
        "eta_runtime_s": None,
        "eta_basis": None,
        "made_at": made_at,
    }
