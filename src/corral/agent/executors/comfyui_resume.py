"""A ComfyUI job's sampling checkpoints: what the segmented graph saves, and resuming from it.

Each latent a segment's ``SaveLatent`` wrote (``comfyui_segments.py``) is read
back through ``/view`` into the job's checkpoint directory as
``comfyui-<step>/`` (the latent and ``resume.json``: the sampler node and its
step) and reported as a ``Checkpoint``; the agent uploads it in the background
(``agent/checkpoints.py``) while ComfyUI samples the next segment, and the
server keeps the latest. A resumed attempt finds that directory in
``resume_from``, uploads the latent to its backend as it uploads input files
(``comfyui_inputs.py``), and the graph loads it in place of the steps done.

The segment size bounds the work a lost machine costs: ``checkpoint_steps``
in the payload, else as many steps as fit in ``checkpoint_every_s`` (10 s by
default) at the step time this executor last measured on its backend.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx

from corral.agent.executors.base import Checkpoint, JobWork
from corral.agent.executors.comfyui_inputs import upload_file
from corral.agent.executors.comfyui_segments import Range, Resume, Segmented, segment
from corral.agent.executors.http_common import check_response
from corral.core import InvalidSpec

log = logging.getLogger("corral.agent.comfyui")

MAX_LOST_S = 10.0
"""Work a lost machine may cost by default: a checkpoint at least this often."""
FIRST_STEP_S = 1.0
"""The step time assumed before one is measured (a large SDXL step on a consumer GPU)."""
MANIFEST = "resume.json"
LATENT = "latent.latent"


def segment_steps(payload: Any, step_s: float | None) -> int:
    """Steps per segment: ``checkpoint_steps``, else ``checkpoint_every_s`` of sampling."""
    steps = payload.get("checkpoint_steps")
    if steps is not None:
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise InvalidSpec("payload.checkpoint_steps", "must be a whole number of steps >= 1")
        return steps
    every = payload.get("checkpoint_every_s", MAX_LOST_S)
    if not isinstance(every, int | float) or isinstance(every, bool) or every <= 0:
        raise InvalidSpec("payload.checkpoint_every_s", "must be a number of seconds > 0")
    return max(1, int(float(every) / max(step_s or FIRST_STEP_S, 1e-3)))


async def segmented(
    client: httpx.AsyncClient,
    graph: dict[str, Any],
    job: JobWork,
    backend: str,
    every: int,
) -> Segmented:
    """The graph to submit: segmented when the job has a checkpoint directory, resumed from
    its checkpoint when it has one this graph can use."""
    if job.checkpoint_dir is None:
        return Segmented(graph)
    resume = None
    found = _read_checkpoint(job.resume_from)
    if found is not None:
        node, step, latent = found
        data = await asyncio.to_thread(latent.read_bytes)
        ref = await upload_file(client, f"{job.job_id}-resume-{step}.latent", data, backend)
        resume = Resume(node, step, ref)
    return segment(graph, every, job.job_id, resume)


def _read_checkpoint(path: str | None) -> tuple[str, int, Path] | None:
    """(sampler node, step, latent file) of a ComfyUI checkpoint directory, else None."""
    if not path:
        return None
    folder = Path(path)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        node, step = str(manifest["node"]), int(manifest["step"])
    except (OSError, ValueError, KeyError, TypeError):
        log.info("%s is not a ComfyUI sampling checkpoint: starting afresh", path)
        return None
    latent = folder / LATENT
    return (node, step, latent) if latent.is_file() else None


async def save_checkpoint(
    client: httpx.AsyncClient,
    entry: dict[str, Any],
    where: Range,
    job: JobWork,
    backend: str,
) -> Checkpoint | None:
    """The latent a segment saved (``entry``: its ``/view`` reference) as a corral checkpoint."""
    assert job.checkpoint_dir is not None
    params = {k: str(entry.get(k, "")) for k in ("filename", "subfolder", "type")}
    response = await client.get("/view", params=params)
    if response.status_code == 404:
        return None  # gone already: the next segment's will do
    data = check_response(response, backend, "/view").content
    folder = Path(job.checkpoint_dir) / f"comfyui-{where.start:06d}"

    def write() -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / LATENT).write_bytes(data)
        manifest = {"node": where.sampler, "step": where.start, "steps": where.total}
        (folder / MANIFEST).write_text(json.dumps(manifest))

    await asyncio.to_thread(write)
    return Checkpoint(str(folder), where.start, where.start / max(1, where.total))
