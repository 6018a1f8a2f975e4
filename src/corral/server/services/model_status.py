"""What agents say about their model caches, and where each model is.

An agent sends a ``ModelReport`` (models on disk and loaded, downloads in
flight, its cache budget) after its Welcome and whenever that changes. The
models on disk and loaded go into the node's inventory in the store (a
guarded update that bumps the node's version, so the scheduler's snapshot
picks them up and routes by them); downloads are kept in memory, since they
move every second and matter only while they run.

``sites(model)`` answers "where is this model": per node, loaded, on disk,
or downloading (with progress) — what ``GET /v1/models`` and the dashboard show.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Node
from corral.server.agentlink.model_wire import DownloadInfo, ModelReport
from corral.server.services.unit import Runtime
from corral.server.store import nodes as node_repo
from corral.server.store.tables import nodes as nodes_table

log = logging.getLogger("corral.server.models")

BUDGET_KEY = "models_budget_bytes"  # kept in the node's inventory JSON next to its models
USED_KEY = "models_used_bytes"


@dataclass(frozen=True, slots=True)
class Site:
    """One node's copy of a model."""

    node: str
    state: str  # "loaded" | "on_disk" | "downloading" | "failed"
    progress: float | None = None  # downloads: 0..1
    node_state: str = "ready"
    error: str = ""


@dataclass(frozen=True, slots=True)
class CacheBudget:
    budget_bytes: int
    used_bytes: int


class ModelStatusService:
    """Agents' model reports in; cache locations out."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.downloads: dict[str, tuple[DownloadInfo, ...]] = {}  # node -> in flight

    async def report(self, node: str, report: ModelReport) -> None:
        """Record a node's cache; write its models to the store when they changed."""
        self.downloads[node] = tuple(d for d in report.downloads if d.state != "done")
        async with self.rt.db.read() as conn:
            rec = await node_repo.get(conn, node)
            raw = await _inventory(conn, node)
        if rec is None or raw is None:
            return
        n = rec.node
        same = (n.models_on_disk, n.models_loaded) == (report.on_disk, report.loaded)
        if same and raw.get(BUDGET_KEY) == report.budget_bytes:
            return
        inventory = dict(raw) | {
            "models_on_disk": sorted(report.on_disk),
            "models_loaded": sorted(report.loaded),
            BUDGET_KEY: report.budget_bytes,
            USED_KEY: report.used_bytes,
        }
        async with self.rt.tx(reschedule=not same) as tx:
            if not await node_repo.update(tx.conn, rec, inventory=inventory):
                log.info("node %s changed while its models were recorded; next report", node)

    def forget(self, node: str) -> None:
        self.downloads.pop(node, None)

    def sites(self, model: str, nodes: Iterable[Node]) -> list[Site]:
        """Where ``model`` is: loaded, on disk or downloading, per node (by name)."""
        out: list[Site] = []
        for n in sorted(nodes, key=lambda n: n.name):
            where = self._site(model, n)
            if where is not None:
                out.append(where)
        return out

    def _site(self, model: str, n: Node) -> Site | None:
        state = n.state.value
        if model in n.models_loaded:
            return Site(n.name, "loaded", node_state=state)
        if model in n.models_on_disk:
            return Site(n.name, "on_disk", node_state=state)
        for d in self.downloads.get(n.name, ()):
            if d.model == model:
                kind = "failed" if d.state == "failed" else "downloading"
                return Site(n.name, kind, round(d.fraction, 4), state, d.error)
        return None

    async def budgets(self, conn: AsyncConnection) -> dict[str, CacheBudget]:
        """Each node's model cache budget and use, as its agent last reported them."""
        rows = await conn.execute(sa.select(nodes_table.c.name, nodes_table.c.inventory))
        out: dict[str, CacheBudget] = {}
        for row in rows:
            inv: Mapping[str, Any] = row.inventory or {}
            budget = int(inv.get(BUDGET_KEY) or 0)
            if budget > 0:
                out[row.name] = CacheBudget(budget, int(inv.get(USED_KEY) or 0))
        return out

    def in_flight(self) -> dict[str, frozenset[str]]:
        """Models each node is downloading now (a prefetch need not be asked twice)."""
        return {
            node: frozenset(d.model for d in ds if d.state != "failed")
            for node, ds in self.downloads.items()
        }


async def _inventory(conn: AsyncConnection, node: str) -> dict[str, Any] | None:
    query = sa.select(nodes_table.c.inventory).where(nodes_table.c.name == node)
    row = (await conn.execute(query)).first()
    return dict(row.inventory or {}) if row else None
