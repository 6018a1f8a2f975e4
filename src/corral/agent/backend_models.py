"""What checkpoints this node's HTTP backends have, for the agent's inventory.

The server routes work to nodes that have (or have loaded) a job's model and
refuses a drop-in API request for a checkpoint no node has; for that it must
know what each AUTOMATIC1111 or ComfyUI backend holds. The agent asks them
when it starts (a backend that does not answer reports nothing: the agent
still joins) and adds the webui's checkpoint names to ``models_on_disk``, the
loaded one to ``loaded`` (per backend). ComfyUI's checkpoint files are not
reported: they are a namespace of their own (file names), would mix with the
webui's in the node's one list, and the server reads them from ``/object_info``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from corral.core.model import EMPTY

log = logging.getLogger("corral.agent")

PROBE_TIMEOUT_S = 5.0
"""A backend that takes longer to list its models is reported without them."""


@dataclass(frozen=True, slots=True)
class BackendModels:
    on_disk: tuple[str, ...] = ()
    loaded: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: EMPTY)


async def probe(a1111: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> BackendModels:
    """The webui's checkpoints (nothing when it does not answer)."""
    if not a1111:
        return BackendModels()
    try:
        names, current = await _a1111(a1111, timeout_s)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        log.warning("could not list the a1111 backend's models at %s: %s", a1111, exc)
        return BackendModels()
    return BackendModels(tuple(sorted(names)), {"a1111": (current,) if current else ()})


async def _a1111(base_url: str, timeout_s: float) -> tuple[list[str], str | None]:
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_s) as client:
        models: list[dict[str, Any]] = (await _json(client, "/sdapi/v1/sd-models")) or []
        options: dict[str, Any] = (await _json(client, "/sdapi/v1/options")) or {}
    names = [str(m.get("model_name") or m["title"]) for m in models]
    title = str(options.get("sd_model_checkpoint") or "")
    current = next((str(m.get("model_name")) for m in models if m.get("title") == title), None)
    return names, current


async def _json(client: httpx.AsyncClient, path: str) -> Any:
    response = await client.get(path)
    response.raise_for_status()
    return response.json()
