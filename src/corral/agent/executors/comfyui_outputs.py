"""What a ComfyUI prompt saved, fetched as a job's results, each file's place kept.

ComfyUI's ``/history/{id}`` lists each output node's files under the key of their
kind (``images``, ``latents`` of ``SaveLatent``, ``gifs`` of VideoHelperSuite,
``audio``, ``3d`` ...), each with its ``subfolder`` and ``type``; some nodes list
text rather than files. Result files are flat names, so the executor adds one
more result, ``comfyui-outputs.json``: the prompt's history ``outputs`` as
ComfyUI gave them, each file entry with the ``result`` name it was saved under.
The drop-in API rebuilds ComfyUI's ``/history`` and ``executed`` messages from it,
and an SDK user reads each file's kind, node and subfolder there.

ComfyUI caches: a graph it ran before runs nothing and its history points at the
files the earlier prompt saved, which may have been deleted since (``/view``
answers 404). Such an output is re-run with ``rerun_outputs``: it adds an input
ComfyUI ignores (no node declares it, so validation and execution skip it) to
the output nodes whose files are gone; an input is part of a node's cache key,
so those nodes run again (and save again) on the upstream results ComfyUI still
holds, while every other node stays cached. The other ways to miss the cache are
worse: a unique ``client_id`` is not part of the key, ``POST /free`` with
``free_memory`` unloads every model and empties the cache for all users (and acts
only between prompts), and a new seed changes the picture.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from corral.agent.executors.base import Result
from corral.agent.executors.http_common import check_response
from corral.core.comfyui import OUTPUTS_MANIFEST as OUTPUTS_MANIFEST

RERUN_INPUT = "corral_rerun"
"""The input added to an output node to run it again (ComfyUI ignores inputs its node
does not declare, but counts them in the node's cache key)."""
CHUNK_BYTES = 1 << 20  # a saved file is streamed to disk this much at a time


class OutputGone(Exception):
    """``/view`` answered 404 for a file the history lists (a cached result, since deleted)."""

    def __init__(self, node_id: str, filename: str) -> None:
        super().__init__(f"{filename} of node {node_id}")
        self.node_id, self.filename = node_id, filename


async def fetch_outputs(
    client: httpx.AsyncClient, outputs: Mapping[str, Any], keep: Path | None, backend: str
) -> tuple[Result, ...]:
    """Every file in ``outputs`` through ``/view`` (into ``keep`` when given), then the
    manifest; raises ``OutputGone`` for the first file that is not there any more."""
    results: list[Result] = []
    names: set[str] = set()
    manifest: dict[str, Any] = {}
    for node_id in sorted(outputs, key=str):
        shown = outputs[node_id]
        if not isinstance(shown, Mapping):
            continue
        manifest[node_id] = entry = json.loads(json.dumps(shown))
        for value in entry.values():
            for saved in value if isinstance(value, list) else []:
                if not _is_saved_file(saved):
                    continue
                params = {k: str(saved.get(k, "")) for k in ("filename", "subfolder", "type")}
                saved["result"] = name = unique(params["filename"], names)
                fetched = await _fetch(client, params, name, keep, len(results), backend)
                if fetched is None:
                    raise OutputGone(str(node_id), params["filename"])
                results.append(fetched)
    if not manifest:
        return ()
    data = json.dumps({"outputs": manifest}, sort_keys=True).encode()
    return (*results, Result(OUTPUTS_MANIFEST, data, "application/json"))


def rerun_outputs(workflow: Mapping[str, Any], nodes: set[str], token: str) -> dict[str, Any]:
    """``workflow`` with ``nodes`` marked to run again (see the module's docstring)."""
    graph: dict[str, Any] = json.loads(json.dumps(workflow))
    for node_id in nodes:
        node = graph.get(node_id)
        if isinstance(node, dict):
            node.setdefault("inputs", {})[RERUN_INPUT] = token
    return graph


def saved_files(node_output: object) -> list[Mapping[str, Any]]:
    """The files one output node saved: entries naming a ``filename`` under any key
    (``images``, ``gifs``, ``audio`` ...), less ``temp`` ones (previews, not results)."""
    if not isinstance(node_output, Mapping):
        return []
    return [
        entry
        for value in node_output.values()
        if isinstance(value, list)
        for entry in value
        if _is_saved_file(entry)
    ]


def unique(filename: str, taken: set[str]) -> str:
    """``filename`` (its last part), with ``-2``, ``-3`` ... before the suffix when two
    outputs share a name (two subfolders)."""
    name = Path(filename).name or "output"
    stem, suffix, n = Path(name).stem, Path(name).suffix, 1
    while name in taken or name == OUTPUTS_MANIFEST:
        n += 1
        name = f"{stem}-{n}{suffix}"
    taken.add(name)
    return name


def _is_saved_file(entry: object) -> bool:
    return isinstance(entry, dict) and bool(entry.get("filename")) and entry.get("type") != "temp"


async def _fetch(
    client: httpx.AsyncClient,
    params: dict[str, str],
    name: str,
    keep: Path | None,
    index: int,
    backend: str,
) -> Result | None:
    """One saved file: its bytes, or (``keep``) streamed into a file there; None if gone."""
    if keep is None:
        response = await client.get("/view", params=params)
        if response.status_code == 404:
            return None
        check_response(response, backend, "/view")
        return Result(name, response.content, _mime(response))
    keep.mkdir(parents=True, exist_ok=True)
    path = keep / f"{index}-{name}"
    async with client.stream("GET", "/view", params=params) as response:
        if response.status_code == 404:
            return None
        if not response.is_success:
            await response.aread()
            check_response(response, backend, "/view")
        with path.open("wb") as out:
            async for chunk in response.aiter_bytes(CHUNK_BYTES):
                out.write(chunk)
    return Result(name, b"", _mime(response), path=path)


def _mime(response: httpx.Response) -> str:
    return str(response.headers.get("content-type", "application/octet-stream")).split(";")[0]
