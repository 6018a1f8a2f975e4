"""A ComfyUI job's input files: uploaded to the backend, and the graph pointed at them.

Each file the job names (``JobWork.inputs``, fetched by the agent) is uploaded
with ComfyUI's own ``POST /upload/image`` (what its web UI does for a ``LoadImage``)
under a name unique to the job (``<job>-<n><ext>``, so jobs never read each
other's files and a name a user uploaded by hand is never overwritten), into
ComfyUI's temp folder, subfolder ``corral``: ComfyUI empties that folder each
time it starts, so the files do not pile up in its input folder and its
``LoadImage`` list. Then every literal input of the graph equal to a file's
name (``"photo.png"`` in a ``LoadImage``'s ``image``, or any custom node's) is
replaced by the uploaded file's reference as ComfyUI's ``LoadImage`` resolves it:
``corral/<job>-<n>.png [temp]`` (ComfyUI's annotated file path).
"""

from __future__ import annotations

import asyncio
import copy
import mimetypes
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import httpx

from corral.agent.executors.base import JobWork
from corral.agent.executors.http_common import check_response

SUBFOLDER = "corral"
UPLOAD_TYPE = "temp"  # ComfyUI's upload types: input | temp | output


async def upload_inputs(
    client: httpx.AsyncClient, workflow: dict[str, Any], job: JobWork, backend: str
) -> dict[str, Any]:
    """Upload the job's input files; the graph with their names replaced (``workflow``
    itself when the job has none)."""
    if not job.inputs:
        return workflow
    refs: dict[str, str] = {}
    for i, item in enumerate(job.inputs):
        if item.path is None:
            continue  # not fetched: the backend says which input it misses
        suffix = PurePosixPath(item.name).suffix[:16]
        data = await asyncio.to_thread(item.path.read_bytes)
        refs[item.name] = await upload_file(client, f"{job.job_id}-{i}{suffix}", data, backend)
    return rewrite(workflow, refs)


async def upload_file(client: httpx.AsyncClient, unique: str, data: bytes, backend: str) -> str:
    """One file into ComfyUI's temp folder (see the module doc); its reference."""
    mime = mimetypes.guess_type(unique)[0] or "application/octet-stream"
    response = await client.post(
        "/upload/image",
        files={"image": (unique, data, mime)},
        data={"type": UPLOAD_TYPE, "subfolder": SUBFOLDER, "overwrite": "true"},
    )
    answer = check_response(response, backend, "/upload/image").json()
    return reference(answer)


def reference(answer: Mapping[str, Any]) -> str:
    """How a ``LoadImage`` names an uploaded file, from ``/upload/image``'s answer
    ``{name, subfolder, type}``: ``subfolder/name``, annotated ``[temp]`` / ``[output]``
    outside the input folder (ComfyUI's ``folder_paths.get_annotated_filepath``)."""
    name = str(answer.get("name", ""))
    subfolder = str(answer.get("subfolder") or "")
    kind = str(answer.get("type") or "input")
    path = f"{subfolder}/{name}" if subfolder else name
    return path if kind == "input" else f"{path} [{kind}]"


def rewrite(workflow: Mapping[str, Any], refs: Mapping[str, str]) -> dict[str, Any]:
    """A copy of ``workflow`` with every literal input equal to a key of ``refs`` replaced."""
    graph = copy.deepcopy(dict(workflow))
    for node in graph.values():
        inputs = node.get("inputs") if isinstance(node, dict) else None
        if not isinstance(inputs, dict):
            continue
        for key, value in inputs.items():
            if isinstance(value, str) and value in refs:
                inputs[key] = refs[value]
    return graph
