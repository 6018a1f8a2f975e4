"""What models this node's HTTP backends have on disk, for the agent's inventory.

The server routes work to nodes that have (or have loaded) every model a job
names, checkpoint and LoRAs and VAE alike, and refuses a drop-in API request
for a checkpoint no node has; for that it must know what each AUTOMATIC1111 or
ComfyUI backend holds. The agent asks them when it starts, and again after a
backend refused work for a model it lacks (the list was stale); a backend that
does not answer reports nothing (the agent still joins). Names are spelled as
``corral.core.model_names`` says: checkpoints bare, the rest ``lora:``,
``vae:``, ``embedding:``-prefixed.

* AUTOMATIC1111: ``/sdapi/v1/sd-models`` (``model_name``), ``/sdapi/v1/loras``
  (the built-in Lora extension's route: ``name`` and ``alias``, either of which a
  prompt's ``<lora:...>`` may use), ``/sdapi/v1/sd-vae`` (``model_name``),
  ``/sdapi/v1/embeddings`` (the names under ``loaded`` and ``skipped``), and the
  loaded checkpoint from ``/sdapi/v1/options``;
* ComfyUI: ``/models/checkpoints``, ``/models/loras``, ``/models/vae``,
  ``/models/embeddings`` (file names, as the loaders' inputs take them).

A list a backend does not serve (a webui without the Lora extension, a ComfyUI
older than its ``/models`` routes) is left out; the rest still counts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from corral.core.model import EMPTY
from corral.core.model_names import named

log = logging.getLogger("corral.agent")

PROBE_TIMEOUT_S = 5.0
"""A backend that takes longer to list its models is reported without them."""

MAX_LISTED = 4096
"""Names taken from one list: a node's inventory travels in every model report, and a
backend with more files than this (rare: people keep dozens to hundreds) lists the first."""

COMFYUI_FOLDERS = {"checkpoints": "", "loras": "lora", "vae": "vae", "embeddings": "embedding"}
"""ComfyUI model folders reported, and the kind each holds."""


@dataclass(frozen=True, slots=True)
class BackendModels:
    on_disk: tuple[str, ...] = ()
    loaded: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: EMPTY)


async def probe(
    a1111: str | None, comfyui: str | None = None, timeout_s: float = PROBE_TIMEOUT_S
) -> BackendModels:
    """The backends' models on disk, and the webui's loaded checkpoint."""
    names: set[str] = set()
    loaded: dict[str, tuple[str, ...]] = {}
    for backend, url in (("a1111", a1111), ("comfyui", comfyui)):
        if not url:
            continue
        try:
            async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout_s) as client:
                if backend == "a1111":
                    found, current = await _a1111(client)
                    loaded["a1111"] = (current,) if current else ()
                else:
                    found = await _comfyui(client)
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("could not list the %s backend's models at %s: %s", backend, url, exc)
            continue
        names |= found
    return BackendModels(tuple(sorted(names)), loaded)


async def _a1111(client: httpx.AsyncClient) -> tuple[set[str], str | None]:
    models: list[dict[str, Any]] = await _json(client, "/sdapi/v1/sd-models", [])
    options: dict[str, Any] = await _json(client, "/sdapi/v1/options", {})
    found = {str(m.get("model_name") or m["title"]) for m in models}
    for lora in await _json(client, "/sdapi/v1/loras", []):
        found |= {named("lora", str(lora[k])) for k in ("name", "alias") if lora.get(k)}
    for vae in await _json(client, "/sdapi/v1/sd-vae", []):
        found.add(named("vae", str(vae["model_name"])))
    embeddings = await _json(client, "/sdapi/v1/embeddings", {})
    for group in ("loaded", "skipped"):
        found |= {named("embedding", str(n)) for n in embeddings.get(group) or {}}
    title = str(options.get("sd_model_checkpoint") or "")
    current = next((str(m.get("model_name")) for m in models if m.get("title") == title), None)
    return found, current


async def _comfyui(client: httpx.AsyncClient) -> set[str]:
    found: set[str] = set()
    for folder, kind in COMFYUI_FOLDERS.items():
        found |= {named(kind, str(f)) for f in await _json(client, f"/models/{folder}", [])}
    return found


async def _json(client: httpx.AsyncClient, path: str, missing: Any) -> Any:
    """The body of ``GET path`` (a list cut to ``MAX_LISTED``); ``missing`` when the
    backend does not serve that list."""
    response = await client.get(path)
    if response.status_code == 404:
        return missing
    response.raise_for_status()
    body = response.json()
    if isinstance(body, list) and len(body) > MAX_LISTED:
        log.warning("%s lists %d models; reporting the first %d", path, len(body), MAX_LISTED)
        return body[:MAX_LISTED]
    return body
