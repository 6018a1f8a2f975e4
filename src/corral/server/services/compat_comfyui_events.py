"""A prompt's corral events as the messages ComfyUI sends on ``/ws`` (pure).

ComfyUI tells a client about its prompt with ``execution_start``,
``execution_cached``, ``executing`` (a node id, then ``null`` at the very
end), ``progress`` (``value``/``max`` of the running node), ``executed`` (a
node's outputs), ``execution_success`` / ``execution_error`` /
``execution_interrupted``, and binary preview frames. corral's job events carry
the same facts (the agent reads them from the backend's own socket), so each
job event becomes the messages ComfyUI would have sent at that moment.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.core.events import Event, EventKind
from corral.server.services.compat_comfyui import output_nodes, outputs_for

PREVIEW_IMAGE = 1  # binary event type
IMAGE_FORMAT = {"image/jpeg": 1, "image/png": 2}
_NODE = re.compile(r"^node (?P<node>\S+?)(?::? (?P<value>\d+)/(?P<max>\d+))?$")


@dataclass(frozen=True, slots=True)
class PreviewRef:
    """A preview to send as a binary frame, once its bytes are read from the blob store."""

    url: str
    content_type: str


Message = dict[str, Any] | PreviewRef


@dataclass
class PromptWatch:
    """What one prompt's socket has been told so far."""

    job_id: str
    prompt_id: str
    workflow: Mapping[str, Any]
    node: str | None = None  # the node last announced as executing
    ended: bool = False
    manifest: Mapping[str, Any] | None = None  # how the backend listed its outputs, once known


def translate(event: Event, watch: PromptWatch) -> list[Message]:
    """The ComfyUI messages for one job event of ``watch``'s prompt."""
    stamp = int(event.at * 1000)
    pid = watch.prompt_id
    if event.kind is EventKind.JOB_STARTED:
        return [
            _msg("execution_start", prompt_id=pid, timestamp=stamp),
            _msg("execution_cached", nodes=[], prompt_id=pid, timestamp=stamp),
        ]
    if event.kind is EventKind.JOB_PROGRESS:
        return _progress(event.data, watch)
    if event.kind is EventKind.JOB_PREVIEW:
        mime = str(event.data.get("content_type", "image/jpeg"))
        return [PreviewRef(str(event.data.get("url", "")), mime)]
    if event.kind is EventKind.JOB_SUCCEEDED:
        return _succeeded(event, watch, stamp)
    if event.kind in (EventKind.JOB_FAILED, EventKind.JOB_CANCELLED):
        return _ended_badly(event, watch, stamp)
    return []


def _progress(data: Mapping[str, Any], watch: PromptWatch) -> list[Message]:
    match = _NODE.match(str(data.get("message", "")))
    if match is None and watch.node is not None:
        return []  # the agent's own "all done" after the node's figures: ComfyUI has no such
    node = match.group("node") if match else (watch.node or _first_sampler(watch.workflow))
    if match and match.group("value"):
        value, top = int(match.group("value")), int(match.group("max"))
    else:
        value, top = round(float(data.get("progress", 0.0)) * 100), 100
    out: list[Message] = []
    if node != watch.node:
        watch.node = node
        out.append(_msg("executing", node=node, display_node=node, prompt_id=watch.prompt_id))
    out.append(_msg("progress", value=value, max=top, prompt_id=watch.prompt_id, node=node))
    return out


def _succeeded(event: Event, watch: PromptWatch, stamp: int) -> list[Message]:
    files = [str(f) for f in event.data.get("files", [])]
    outputs = outputs_for(watch.workflow, files, watch.job_id, watch.manifest)
    out: list[Message] = []
    for node, output in outputs.items():
        out.append(_msg("executing", node=node, display_node=node, prompt_id=watch.prompt_id))
        out.append(
            _msg("executed", node=node, display_node=node, output=output, prompt_id=watch.prompt_id)
        )
    if event.data.get("interrupted"):
        out.append(_interrupted(watch, stamp, list(outputs)))
    else:
        out.append(_msg("execution_success", prompt_id=watch.prompt_id, timestamp=stamp))
    return [*out, *_finish(watch)]


def _ended_badly(event: Event, watch: PromptWatch, stamp: int) -> list[Message]:
    if event.kind is EventKind.JOB_CANCELLED:
        return [_interrupted(watch, stamp, []), *_finish(watch)]
    node = watch.node or _first_sampler(watch.workflow)
    kind = _class_type(watch.workflow, node)
    error = _msg(
        "execution_error",
        prompt_id=watch.prompt_id,
        node_id=node,
        node_type=kind,
        executed=[],
        exception_message=str(event.data.get("error", "")),
        exception_type="corral.JobFailed",
        traceback=[],
        current_inputs={},
        current_outputs={},
        timestamp=stamp,
    )
    return [error, *_finish(watch)]


def _interrupted(watch: PromptWatch, stamp: int, executed: list[str]) -> dict[str, Any]:
    node = watch.node or _first_sampler(watch.workflow)
    kind = _class_type(watch.workflow, node)
    return _msg(
        "execution_interrupted",
        prompt_id=watch.prompt_id,
        node_id=node,
        node_type=kind,
        executed=executed,
        timestamp=stamp,
    )


def _finish(watch: PromptWatch) -> list[Message]:
    """The last message of every prompt: ``executing`` with no node."""
    watch.ended = True
    return [_msg("executing", node=None, display_node=None, prompt_id=watch.prompt_id)]


def _first_sampler(workflow: Mapping[str, Any]) -> str:
    for node_id, node in workflow.items():
        if isinstance(node, dict) and "Sampler" in str(node.get("class_type", "")):
            return str(node_id)
    saving = output_nodes(workflow)
    return saving[0] if saving else next(iter(workflow), "0")


def _class_type(workflow: Mapping[str, Any], node_id: str) -> str:
    node = workflow.get(node_id)
    return str(node.get("class_type", "")) if isinstance(node, dict) else ""


def _msg(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, "data": data}


def status_message(queue_remaining: int, sid: str | None = None) -> dict[str, Any]:
    """``status``: how many prompts wait (this client's); ``sid`` only on connect."""
    data: dict[str, Any] = {"status": {"exec_info": {"queue_remaining": queue_remaining}}}
    if sid is not None:
        data["sid"] = sid
    return {"type": "status", "data": data}


def preview_frame(image: bytes, content_type: str) -> bytes:
    """A binary preview frame: event type 1, image format (1 JPEG, 2 PNG), the image."""
    return struct.pack(">II", PREVIEW_IMAGE, IMAGE_FORMAT.get(content_type, 1)) + image
