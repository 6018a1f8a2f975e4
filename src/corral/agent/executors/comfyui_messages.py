"""Reading ComfyUI's answers: JSON bodies, name lists, preview frames, error messages."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import httpx

from corral.agent.executors.base import Preview

PREVIEW_IMAGE, PREVIEW_IMAGE_WITH_METADATA = 1, 4
IMAGE_MIME = {1: "image/jpeg", 2: "image/png"}


def json_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def names(response: httpx.Response) -> list[str]:
    """A JSON list of names, or none (a backend without the route, or a bad answer)."""
    try:
        body = response.json() if response.status_code == 200 else []
    except ValueError:
        return []
    return [str(n) for n in body] if isinstance(body, list) else []


def preview(frame: bytes) -> Preview | None:
    if len(frame) < 8:
        return None
    (event,) = struct.unpack(">I", frame[:4])
    if event == PREVIEW_IMAGE:
        (image_type,) = struct.unpack(">I", frame[4:8])
        return Preview(frame[8:], IMAGE_MIME.get(image_type, "image/jpeg"))
    if event == PREVIEW_IMAGE_WITH_METADATA:
        (size,) = struct.unpack(">I", frame[4:8])
        meta = json.loads(frame[8 : 8 + size])
        return Preview(frame[8 + size :], str(meta.get("image_type", "image/jpeg")))
    return None


def error_text(data: Mapping[str, Any]) -> str:
    where = f"node {data.get('node_id')} ({data.get('node_type')})"
    kind, message = data.get("exception_type", "error"), data.get("exception_message", "")
    return f"{kind} in {where}: {message}".strip()
