"""What the connected backends offer: their models, samplers, upscalers, LoRAs, nodes.

Two sources, because a home GPU behind NAT cannot be asked directly:

* **inventory**: each agent reads its backends' checkpoints when it starts and
  reports them with its node (``models_on_disk``, and the loaded one in
  ``models_loaded``); the server has this for every connected node;
* **catalog**: the full lists (``/sdapi/v1/sd-models``, ``/samplers``,
  ``/upscalers``, ``/loras``, ``/options``; ComfyUI's ``/object_info``) come
  from a small corral job (``payload: {"mode": "catalog"}``, no GPU and no CPU
  slot, so it never waits behind work) that runs on a node with the backend.
  Its answer is kept for ``compat.catalog_ttl_s``; concurrent callers share one job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from corral.core.errors import Unavailable
from corral.core.model import Node
from corral.core.model_names import is_checkpoint
from corral.core.states import JobState
from corral.server.services.compat import Caller, CompatJobs, Submission
from corral.server.services.policy import may_use

CATALOG_FILE = "catalog.json"
CATALOG_USER = "corral-catalog"  # catalog jobs are the server's asking, not the caller's work
NO_RESOURCES = {"gpus": 0, "cpus": 0}  # a catalog job fits anywhere, beside any work


@dataclass(frozen=True, slots=True)
class Catalog:
    """One backend's lists, as its node answered them, and when."""

    data: Mapping[str, Any]
    node: str | None
    at: float

    def entries(self, name: str) -> list[Any]:
        value = self.data.get(name)
        return list(value) if isinstance(value, list) else []


class CatalogCache:
    """Backend catalogs fetched through catalog jobs, kept for a while."""

    def __init__(self, jobs: CompatJobs) -> None:
        self.jobs = jobs
        self._kept: dict[str, Catalog] = {}
        self._fetching: dict[str, asyncio.Task[Catalog]] = {}

    async def get(self, caller: Caller, backend: str) -> Catalog:
        """``backend``'s catalog: the kept one while fresh, else a new catalog job's answer."""
        await self.jobs.backend_nodes(caller, backend)  # none connected: say so now
        now = self.jobs.plane.rt.clock.now()
        kept = self._kept.get(backend)
        if kept is not None and now - kept.at < self.jobs.settings.catalog_ttl_s:
            return kept
        task = self._fetching.get(backend)
        if task is None:
            task = asyncio.create_task(self._fetch(caller, backend))
            self._fetching[backend] = task
            task.add_done_callback(lambda _: self._fetching.pop(backend, None))
        try:
            return await asyncio.wait_for(
                asyncio.shield(task), self.jobs.settings.catalog_timeout_s
            )
        except TimeoutError:
            if kept is not None:
                return kept  # stale beats nothing
            raise Unavailable(
                f"the {backend} backend did not list what it has within "
                f"{self.jobs.settings.catalog_timeout_s:g}s (is its node busy or stuck?)"
            ) from None

    async def _fetch(self, caller: Caller, backend: str) -> Catalog:
        sub = Submission(
            backend=backend,
            payload={"mode": "catalog"},
            kind="custom",
            priority=self._most_urgent(caller),
            resources=NO_RESOURCES,
            max_attempts=2,
            user=CATALOG_USER,
        )
        rec, _ = await self.jobs.submit(caller, sub)
        done = await self.jobs.wait(caller, rec.job.id)
        if done.state is not JobState.SUCCEEDED:
            raise Unavailable(
                f"the {backend} backend could not list what it has: {done.error or done.state}"
            )
        files = await self.jobs.files(caller, done)
        data: Any = {}
        with contextlib.suppress(ValueError, KeyError):
            data = json.loads(files[CATALOG_FILE])
        if not isinstance(data, dict):
            raise Unavailable(f"the {backend} backend's agent sent no {CATALOG_FILE}")
        catalog = Catalog(data, done.node, self.jobs.plane.rt.clock.now())
        self._kept[backend] = catalog
        return catalog

    def _most_urgent(self, caller: Caller) -> str:
        """The highest class the caller may use: a listing blocks the requests behind it."""
        policy = self.jobs.plane.rt.policy
        usable = [
            c
            for c in policy.priority_classes
            if may_use(policy, caller.principal, caller.team, CATALOG_USER, c.name)
        ]
        return (
            max(usable, key=lambda c: c.rank).name if usable else self.jobs.priority(caller, None)
        )


# ---- models ------------------------------------------------------------------


def model_aliases(entry: Mapping[str, Any]) -> set[str]:
    """Every name a webui checkpoint entry answers to: title, name, file name, with/without hash."""
    title = str(entry.get("title") or "")
    filename = str(entry.get("filename") or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = str(entry.get("model_name") or "")
    names = {title, title.split(" [")[0], name, filename, filename.rsplit(".", 1)[0]}
    return {n for n in names if n}


def find_model(wanted: str, entries: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The checkpoint entry ``wanted`` names (case-sensitive, like the webui), if any."""
    for entry in entries:
        aliases = model_aliases(entry)
        if wanted in aliases or wanted.split(" [")[0] in aliases:
            return entry
    return None


FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".gguf", ".sft")
"""A reported checkpoint named with its file's suffix is a ComfyUI file name (the webui
names its checkpoints by stem, ``model_name``, as the agent reports them): not the
webui's, so not in its list, on a node that runs both."""


def model_entries(catalog: Catalog | None, nodes: Iterable[Node]) -> list[dict[str, Any]]:
    """``/sd-models`` for the cluster: the catalog's entries plus every other webui
    checkpoint a node reported (those have only a name: the webui would show no hash for
    them either)."""
    entries: list[dict[str, Any]] = [
        dict(e) for e in (catalog.entries("sd-models") if catalog else [])
    ]
    for node in nodes:
        for name in sorted(node.models_on_disk | node.models_loaded):
            webui = is_checkpoint(name) and not name.endswith(FILE_SUFFIXES)
            if webui and find_model(name, entries) is None:
                entries.append(
                    {
                        "title": name,
                        "model_name": name,
                        "hash": None,
                        "sha256": None,
                        "filename": name,
                        "config": None,
                    }
                )
    return entries
