"""What the cluster's ComfyUI backends offer, in ComfyUI's shapes (pure).

A ComfyUI client asks one server what it can do: ``/object_info`` (node
types and their inputs), ``/models`` and ``/models/{folder}`` (model files),
``/embeddings``, ``/system_stats`` (the machine and its devices). Behind corral
that "server" is every connected node offering the ``comfyui`` backend, so each
answer is the union over them: a node type any node has is listed, and a
choice list (the checkpoints of ``CheckpointLoaderSimple``) holds every node's
entries. A graph that needs what only some nodes have goes to one of those
(model-aware routing; a node lacking it fails the job retryably).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from corral.core.model import Node

FOLDER_INPUTS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "checkpoints": (("CheckpointLoaderSimple", "ckpt_name"), ("CheckpointLoader", "ckpt_name")),
    "loras": (("LoraLoader", "lora_name"), ("LoraLoaderModelOnly", "lora_name")),
    "vae": (("VAELoader", "vae_name"),),
    "text_encoders": (("CLIPLoader", "clip_name"), ("DualCLIPLoader", "clip_name1")),
    "diffusion_models": (("UNETLoader", "unet_name"),),
    "clip_vision": (("CLIPVisionLoader", "clip_name"),),
    "style_models": (("StyleModelLoader", "style_model_name"),),
    "controlnet": (("ControlNetLoader", "control_net_name"),),
    "gligen": (("GLIGENLoader", "gligen_name"),),
    "upscale_models": (("UpscaleModelLoader", "model_name"),),
    "hypernetworks": (("HypernetworkLoader", "hypernetwork_name"),),
    "photomaker": (("PhotoMakerLoader", "photomaker_model_name"),),
}
"""Where a folder's files show in ``object_info``: the choice list of the input of the
core node that loads them. The backends are asked only for ``object_info``, so a folder
no core node reads (``configs``, ``custom_nodes``) lists nothing."""

MAX_DEVICES = 1024
"""Devices ``/system_stats`` lists (a big cluster's GPUs would make a page of megabytes)."""


def union(infos: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``object_info`` of several backends as one: each node type as the first
    backend described it, its choice lists holding every backend's entries."""
    merged: dict[str, Any] = {}
    for info in infos:
        for name, spec in info.items():
            if not isinstance(spec, Mapping):
                continue
            if name not in merged:
                merged[name] = _copy(spec)
            else:
                _add_choices(merged[name], spec)
    return merged


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def _add_choices(kept: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Extend ``kept``'s choice lists with the entries ``other`` has beyond them."""
    inputs, more = kept.get("input"), other.get("input")
    if not isinstance(inputs, dict) or not isinstance(more, Mapping):
        return
    for group, specs in inputs.items():
        extra = more.get(group)
        if not isinstance(specs, dict) or not isinstance(extra, Mapping):
            continue
        for key, spec in specs.items():
            mine, theirs = choices(spec), choices(extra.get(key))
            if mine is not None and theirs is not None:
                mine.extend(c for c in theirs if c not in mine)


def choices(spec: Any) -> list[Any] | None:
    """An input's choice list (changed in place by the caller), in either of ComfyUI's
    forms: ``[[a, b], {...}]`` or ``["COMBO", {"options": [a, b]}]``; None if it has none."""
    if not isinstance(spec, list) or not spec:
        return None
    if isinstance(spec[0], list):
        return spec[0]
    options = spec[1].get("options") if len(spec) > 1 and isinstance(spec[1], dict) else None
    return options if spec[0] == "COMBO" and isinstance(options, list) else None


def one_class(info: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``/object_info/{class}``: that class alone, or ``{}`` (ComfyUI answers so too)."""
    return {name: info[name]} if name in info else {}


def folder_files(info: Mapping[str, Any], folder: str) -> list[str]:
    """``/models/{folder}``: the file names the loaders of ``folder`` offer, sorted."""
    names: set[str] = set()
    for node, key in FOLDER_INPUTS.get(folder, ()):
        spec = info.get(node)
        inputs = spec.get("input") if isinstance(spec, Mapping) else None
        for group in inputs.values() if isinstance(inputs, Mapping) else ():
            found = choices(group.get(key)) if isinstance(group, Mapping) else None
            names.update(str(n) for n in found or ())
    return sorted(names)


def system_stats(nodes: Sequence[Node], version: str) -> dict[str, Any]:
    """``/system_stats`` of the cluster: the server's Python, every ComfyUI node's
    devices (each GPU; a CPU-only node as one ``cpu`` device), named ``node: card``."""
    devices: list[dict[str, Any]] = []
    for node in sorted(nodes, key=lambda n: n.name):
        for gpu in node.gpus:
            free = gpu.vram_free_bytes if gpu.vram_free_bytes is not None else gpu.vram_bytes
            name = f"{node.name}: {gpu.model}"
            devices.append(_device(name, "cuda", gpu.index, gpu.vram_bytes, free))
        if not node.gpus:
            devices.append(_device(f"{node.name}: cpu", "cpu", None, 0, 0))
    return {
        "system": {
            "os": sys.platform,
            "ram_total": 0,  # each node's own; the server does not know it
            "ram_free": 0,
            "comfyui_version": f"corral {version}",
            "python_version": sys.version,
            "pytorch_version": "",
            "embedded_python": False,
            "argv": [],
        },
        "devices": devices[:MAX_DEVICES],
    }


def _device(name: str, kind: str, index: int | None, total: int, free: int) -> dict[str, Any]:
    return {
        "name": name,
        "type": kind,
        "index": index,
        "vram_total": total,
        "vram_free": free,
        "torch_vram_total": total,
        "torch_vram_free": free,
    }


JOB_STATUSES = ("pending", "in_progress", "completed", "failed", "cancelled")


def job_entries(
    queue: Mapping[str, Any], history: Mapping[str, Any], statuses: Iterable[str]
) -> list[dict[str, Any]]:
    """ComfyUI's ``/jobs`` entries (its ``comfy_execution/jobs.py`` normalisation) of the
    ``/queue`` and ``/history`` answers, newest first: ``pending``, ``in_progress``, and
    ended prompts as ``completed`` / ``failed`` / ``cancelled``."""
    wanted = set(statuses)
    out: list[dict[str, Any]] = []
    for key, status in (("queue_running", "in_progress"), ("queue_pending", "pending")):
        if status in wanted:
            out.extend(_queued_job(item, status) for item in queue.get(key, ()))
    for prompt_id, entry in history.items():
        job = _ended_job(prompt_id, entry)
        if job["status"] in wanted:
            out.append(job)
    return sorted(out, key=lambda j: j["create_time"], reverse=True)


def _queued_job(item: Sequence[Any], status: str) -> dict[str, Any]:
    number, prompt_id, _, extra = item[0], item[1], item[2], item[3]
    return {
        "id": prompt_id,
        "status": status,
        "priority": number,
        "create_time": int(extra.get("create_time") or 0),
        "outputs_count": 0,
        "previewable_outputs_count": 0,
    }


def _ended_job(prompt_id: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    status = entry.get("status") or {}
    times = {kind: data for kind, data in status.get("messages", ())}
    start = times.get("execution_start", {}).get("timestamp")
    if "execution_interrupted" in times:
        ended, kind = times["execution_interrupted"], "cancelled"
    elif "execution_error" in times:
        ended, kind = times["execution_error"], "failed"
    else:
        ended, kind = times.get("execution_success", {}), "completed"
    files = [
        {**item, "nodeId": node, "mediaType": media}
        for node, shown in (entry.get("outputs") or {}).items()
        for media, items in shown.items()
        if isinstance(items, list)
        for item in items
        if isinstance(item, dict)
    ]
    shown = [f for f in files if f["mediaType"] in ("images", "video", "audio")]
    return {
        "id": prompt_id,
        "status": kind,
        "priority": entry["prompt"][0],
        "create_time": int(entry["prompt"][3].get("create_time") or start or 0),
        "execution_start_time": start,
        "execution_end_time": ended.get("timestamp"),
        "execution_error": times.get("execution_error"),
        "outputs_count": len(files),
        "previewable_outputs_count": len(shown),
        "preview_output": shown[0] if shown else None,
    }
