"""The cluster as one ComfyUI server: what it offers, its whole history, its queue.

The rest of ComfyUI's API that clients (and ComfyUI's own web frontend) call
besides ``/prompt``: ``/object_info``, ``/models``, ``/embeddings`` and
``/system_stats`` answer for every connected ComfyUI node at once
(``compat_comfyui_info.py``); ``/history``, ``GET /prompt`` and clearing the
queue read and change the caller's team's prompts, which are corral jobs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from corral import __version__
from corral.core.comfyui import MODEL_FOLDERS
from corral.core.errors import Conflict, NotFound, Unavailable
from corral.core.states import JOB, JobState
from corral.server.services.backend_info import BackendInfoStore
from corral.server.services.compat import Caller, Unservable
from corral.server.services.compat_comfyui import BACKEND, ComfyService, history_entry
from corral.server.services.compat_comfyui_info import (
    folder_files,
    job_entries,
    system_stats,
    union,
)
from corral.server.services.compat_comfyui_uploads import with_choices
from corral.server.store.records import JobRecord

HISTORY_MAX = 200
"""Entries ``/history`` lists at most (ComfyUI keeps 10,000 in memory and sends them all;
each entry here costs a read of the job's output listing)."""

SCAN_PAGE, SCAN_PAGES = 200, 10
"""Finished jobs looked through for prompts, a page at a time: a team whose recent jobs
are mostly other work shows fewer entries rather than costing a scan of its whole past."""

QUEUE_MAX = 500  # waiting prompts one ``{"clear": true}`` cancels (as ``/queue`` lists)


class ComfyCluster:
    """``/object_info``, ``/models``, ``/embeddings``, ``/system_stats``, ``/history``,
    ``GET /prompt`` and ``POST /queue {"clear": true}`` over the whole cluster."""

    def __init__(self, comfy: ComfyService, described: BackendInfoStore) -> None:
        self.comfy = comfy
        self.jobs = comfy.jobs
        self.described = described
        comfy.described = self.object_info  # /prompt checks graphs against the union too
        # the last union and the descriptions it merged (the same objects while unchanged)
        self._merged: tuple[tuple[Mapping[str, Any], ...], dict[str, Any]] = ((), {})

    # ---- what the backends offer --------------------------------------------

    async def object_info(self, caller: Caller) -> dict[str, Any]:
        """Every connected ComfyUI node's node types as one (``Unservable`` if none)."""
        infos = await self.infos(caller)
        if not infos:
            raise Unservable("the comfyui backends did not describe their nodes")
        kept, merged = self._merged
        if len(kept) != len(infos) or any(a is not b for a, b in zip(kept, infos, strict=True)):
            merged = union(infos)  # each /prompt checks against it: merge once per change
            self._merged = (tuple(infos), merged)
        return merged

    async def offered(self, caller: Caller) -> dict[str, Any]:
        """``/object_info`` as the caller sees it: the union, with its team's uploaded images
        as ``LoadImage``'s choices (ComfyUI lists its input folder there)."""
        info = await self.object_info(caller)
        return with_choices(info, await self.comfy.uploads.input_names(caller.principal))

    async def infos(self, caller: Caller) -> list[Mapping[str, Any]]:
        """The distinct ``object_info`` of the connected ComfyUI nodes, as their agents
        reported them; when some reported none (older agents), a catalog job's answer
        from one node stands in for them."""
        nodes = await self.jobs.backend_nodes(caller, BACKEND)
        found = await self.described.object_infos(n.name for n in nodes)
        if not found.unreported:
            return found.infos
        try:
            catalog = await self.comfy.catalogs.get(caller, BACKEND)
        except Unavailable:
            if found.infos:
                return found.infos  # the reported ones are better than none
            raise
        info = catalog.data.get("object_info")
        return [*found.infos, info] if isinstance(info, Mapping) else found.infos

    async def models(self, caller: Caller, folder: str) -> list[str]:
        """``/models/{folder}``: its files on any node; ``NotFound`` for a folder ComfyUI
        does not have (its 404)."""
        if folder not in MODEL_FOLDERS:
            raise NotFound(f"no model folder {folder!r} (ComfyUI's are {', '.join(MODEL_FOLDERS)})")
        return folder_files(await self.object_info(caller), folder)

    async def embeddings(self, caller: Caller) -> list[str]:
        """``/embeddings``: the names (without extension) any node's backend listed."""
        catalog = await self.comfy.catalogs.get(caller, BACKEND)
        names = {str(n).rsplit(".", 1)[0] for n in catalog.entries("embeddings")}
        return sorted(names)

    async def system_stats(self, caller: Caller) -> dict[str, Any]:
        nodes = await self.jobs.backend_nodes(caller, BACKEND)
        return system_stats(nodes, __version__)

    # ---- the caller's prompts -----------------------------------------------

    async def history(self, caller: Caller, max_items: int | None) -> dict[str, Any]:
        """``/history``: the team's last ``max_items`` ended prompts (at most
        ``HISTORY_MAX``), oldest first, as ComfyUI lists its last ones."""
        wanted = min(max_items if max_items is not None else HISTORY_MAX, HISTORY_MAX)
        ended = await self._ended_prompts(caller, wanted)
        out: dict[str, Any] = {}
        for rec in reversed(ended):
            manifest = await self.comfy.manifest(caller, rec.job.id)
            out[str(rec.job.payload.get("prompt_id"))] = history_entry(rec, manifest)
        return out

    async def _ended_prompts(self, caller: Caller, wanted: int) -> list[JobRecord]:
        """Up to ``wanted`` of the team's ended prompts, newest first."""
        found: list[JobRecord] = []
        cursor = None
        states = tuple(JOB.terminal)
        for _ in range(SCAN_PAGES):
            if len(found) >= wanted:
                break
            page = await self.jobs.plane.jobs.page(
                caller.principal, states=states, limit=SCAN_PAGE, cursor=cursor
            )
            found.extend(r for r in page.jobs if _is_prompt(r))
            cursor = page.next_cursor
            if cursor is None:
                break
        return found[:wanted]

    async def job_list(
        self, caller: Caller, statuses: list[str], limit: int, offset: int
    ) -> dict[str, Any]:
        """``/jobs`` (ComfyUI's newer list, which its frontend's queue panel reads): the
        team's prompts waiting, running and ended (the last ``HISTORY_MAX``), newest first."""
        queue = await self.comfy.queue(caller)
        ended = {"completed", "failed", "cancelled"} & set(statuses)
        history = await self.history(caller, None) if ended else {}
        found = job_entries(queue, history, statuses)
        page = found[offset : offset + limit]
        more = offset + len(page) < len(found)
        return {
            "jobs": page,
            "pagination": {"offset": offset, "limit": limit, "total": len(found), "has_more": more},
        }

    async def queue_info(self, caller: Caller) -> dict[str, Any]:
        """``GET /prompt``: how many of the team's prompts run or wait."""
        queue = await self.comfy.queue(caller)
        remaining = len(queue["queue_running"]) + len(queue["queue_pending"])
        return {"exec_info": {"queue_remaining": remaining}}

    async def clear(self, caller: Caller) -> None:
        """``POST /queue {"clear": true}``: cancel the team's waiting prompts (running
        ones go on, as ComfyUI's wipe leaves the one it runs)."""
        waiting = (JobState.QUEUED, JobState.PLACED)
        page = await self.jobs.plane.jobs.page(caller.principal, states=waiting, limit=QUEUE_MAX)
        for rec in page.jobs:
            if _is_prompt(rec):
                with contextlib.suppress(Conflict):  # it started or ended meanwhile
                    await self.jobs.plane.jobs.cancel(caller.principal, rec.job.id)


def _is_prompt(rec: JobRecord) -> bool:
    return rec.job.backend == BACKEND and "prompt_id" in rec.job.payload
