"""Nodes (pause, resume, drain, delete) and teams (quota, borrow limit, weight) as admins
manage them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from corral.core.errors import Conflict, NotFound
from corral.core.events import EventKind
from corral.core.model import Allocation, Team
from corral.core.states import NodeState
from corral.server.services import audit
from corral.server.services.auth import Principal
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import nodes as node_repo
from corral.server.store.records import NodeRecord

DRAINED_BY_AUTOSCALER = "autoscaler"
"""``pause_reason`` of a node the autoscaler drained on its way out (its own, not a person's)."""


@dataclass(frozen=True, slots=True)
class NodeView:
    record: NodeRecord
    allocations: tuple[Allocation, ...]


class NodeService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def listing(self, who: Principal) -> list[NodeView]:
        """Every node with the allocations it holds (as ``who`` may see them: ``_seen``)."""
        who.require_client()
        async with self.rt.db.read() as conn:
            nodes = await node_repo.all_nodes(conn)
            active = await alloc_repo.active(conn)
        by_node: dict[str, list[Allocation]] = {}
        for a in active:
            by_node.setdefault(a.alloc.node, []).append(_seen(who, a.alloc))
        return [NodeView(n, tuple(by_node.get(n.node.name, ()))) for n in nodes]

    async def get(self, who: Principal, name: str) -> NodeView:
        who.require_client()
        async with self.rt.db.read() as conn:
            rec = await node_repo.get(conn, name)
            active = await alloc_repo.active(conn, node=name)
        if rec is None:
            raise NotFound(f"node {name} not found")
        return NodeView(rec, tuple(_seen(who, a.alloc) for a in active))

    async def delete(self, who: Principal, name: str) -> None:
        """Forget a node that is gone (admin). Only a lost node goes: one that is ready has
        an agent connected, or heard from within ``scheduling.node_timeout_s``, which would
        join again at once (its work is then settled by the liveness loop, not by this)."""
        who.require_admin("delete a node")
        async with self.rt.tx(reschedule=True) as tx:
            rec = await node_repo.get(tx.conn, name)
            if rec is None:
                raise NotFound(f"node {name} not found")
            if rec.node.state is not NodeState.LOST:
                raise Conflict(
                    f"node {name} is {rec.node.state.value}: its agent is connected or was "
                    "heard from within scheduling.node_timeout_s. Stop its agent (drain the "
                    "node first to let its work end); it can be deleted once it is lost"
                )
            if held := await alloc_repo.active(tx.conn, node=name):
                raise Conflict(f"node {name} still holds {len(held)} allocations; retry soon")
            await node_repo.delete(tx.conn, name)
            tx.emit(EventKind.NODE_REMOVED, team=None, node=name, data={"reason": "deleted"})
            await audit.record(tx, who, "node.delete", name)

    async def pause(self, who: Principal, name: str) -> NodeView:
        """No new work; what runs keeps running."""
        return await self._set(who, name, "pause", paused=True)

    async def resume(self, who: Principal, name: str) -> NodeView:
        """Take work again (clears both paused and draining)."""
        return await self._set(who, name, "resume", paused=False, draining=False)

    async def drain(self, who: Principal, name: str) -> NodeView:
        """No new work; the node becomes removable once its allocations end."""
        return await self._set(who, name, "drain", draining=True)

    async def mark(self, name: str, *, draining: bool, reason: str | None) -> None:
        """The autoscaler drains an idle member (``reason`` marks it as its own) or takes it
        back; no principal: the server acts on its own."""
        await self._flags(name, {"draining": draining}, {"pause_reason": reason}, by=reason)

    async def forget(self, name: str, why: str) -> bool:
        """Delete an empty node's row (the autoscaler removed its machine). False, and the
        node kept, when it still has active allocations or is already gone."""
        async with self.rt.tx(reschedule=True) as tx:
            if await alloc_repo.active(tx.conn, node=name):
                return False
            if not await node_repo.delete(tx.conn, name):
                return False
            tx.emit(EventKind.NODE_REMOVED, team=None, node=name, data={"reason": why})
        return True

    async def launched(self, names: list[str], pool: str, why: str) -> None:
        """Record machines the autoscaler asked for (their nodes appear when agents join)."""
        async with self.rt.tx() as tx:
            for name in names:
                tx.emit(EventKind.NODE_LAUNCHED, team=None, node=name, pool=pool, reason=why)

    async def _set(self, who: Principal, name: str, verb: str, **flags: bool) -> NodeView:
        """``verb`` (pause, resume, drain) the node, as an admin asked; audited."""
        who.require_admin(f"{verb} this node")
        extra = {"failure_streak": 0, "pause_reason": None} if flags.get("paused") is False else {}
        await self._flags(name, flags, extra, who=who, verb=verb)  # a resume forgets auto-pauses
        return await self.get(who, name)

    async def _flags(
        self,
        name: str,
        flags: dict[str, bool],
        extra: Mapping[str, object],
        by: str | None = None,
        who: Principal | None = None,
        verb: str = "",
    ) -> None:
        """Set the node's flags; ``by`` names the server's own reason, ``who`` the admin
        whose ``verb`` it is (recorded in the audit log)."""
        async with self.rt.tx(reschedule=True) as tx:
            rec = await node_repo.get(tx.conn, name)
            if rec is None:
                raise NotFound(f"node {name} not found")
            if not await node_repo.update(tx.conn, rec, **flags, **extra):
                raise Conflict(f"node {name} changed meanwhile; retry")
            kind = _event_for(flags)
            tx.emit(kind, team=None, node=name, data=flags | ({"by": by} if by else {}))
            if who is not None:
                await audit.record(tx, who, f"node.{verb}", name, flags)
            intake_open = not (
                flags.get("paused", rec.node.paused) or flags.get("draining", rec.node.draining)
            )

            async def tell_agent() -> None:
                await self.rt.link.set_intake(name, open=intake_open)

            tx.then(tell_agent)

    async def teams(self, who: Principal) -> list[Team]:
        who.require_client()
        async with self.rt.db.read() as conn:
            teams = await node_repo.all_teams(conn)
        return teams if who.is_admin else [t for t in teams if t.name == who.team]

    async def put_team(self, who: Principal, team: Team) -> Team:
        who.require_admin("change team quotas")
        async with self.rt.tx(reschedule=True) as tx:
            before = await node_repo.get_team(tx.conn, team.name)
            await node_repo.put_team(tx.conn, team, tx.now)
            was = _quota(before) if before is not None else None  # None: a new team
            await audit.record(tx, who, "team.set", team.name, _quota(team) | {"before": was})
            tx.emit(
                EventKind.TEAM_UPDATED,
                team=team.name,
                quota_gpus=team.quota_gpus,
                borrow_limit_gpus=team.borrow_limit_gpus,
                weight=team.weight,
            )
        return team


def _quota(team: Team) -> dict[str, object]:
    """A team's quota settings, as the audit log records them."""
    return {
        "quota_gpus": team.quota_gpus,
        "borrow_limit_gpus": team.borrow_limit_gpus,
        "weight": team.weight,
    }


def _seen(who: Principal, alloc: Allocation) -> Allocation:
    """``alloc`` as ``who`` may see it: another team's without its job ids (a team token
    learns that GPUs are busy, never which jobs of another team run on them)."""
    return alloc if who.sees(alloc.team) else replace(alloc, job_ids=())


def _event_for(flags: dict[str, bool]) -> EventKind:
    if flags.get("draining"):
        return EventKind.NODE_DRAINING
    if flags.get("paused"):
        return EventKind.NODE_PAUSED
    return EventKind.NODE_RESUMED
