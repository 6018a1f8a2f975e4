"""The names of the models a job uses, spelled as nodes report what their backends have.

A node's inventory (``Node.models_on_disk``) is one set of names, and a job's
models (``Job.model`` plus ``Job.models``) are matched against it as they are.
Checkpoints go in bare, as their backend names them (the webui's ``model_name``,
ComfyUI's ``ckpt_name`` file name, a registry name); the other kinds carry
their kind as a prefix: ``lora:add_detail``, ``vae:vae-ft-mse.safetensors``,
``embedding:bad-hands``. A LoRA and a checkpoint may share a file name, and a
job naming the LoRA must not be sent to a node that has only the checkpoint.

A backend that refuses work for a model it lacks says so in the failure with
``lacking(...)``; the server reads the names back with ``lacked(...)`` to stop
sending the job there (agent and server share no code but this vocabulary, and
the error text is what both the attempt history and a person read).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

PREFIXED = ("lora", "vae", "embedding", "unet", "clip", "controlnet")
"""Kinds named with a prefix; everything else is a checkpoint (bare name)."""

COMFYUI_INPUTS: Mapping[str, str] = {"ckpt_name": "", "lora_name": "lora", "vae_name": "vae"}
"""ComfyUI inputs that choose a model file nodes report, and the kind of file:
``CheckpointLoaderSimple``, ``LoraLoader`` (and ``LoraLoaderModelOnly``), ``VAELoader``
list the ``checkpoints``, ``loras`` and ``vae`` folders (ComfyUI's nodes.py,
``folder_paths.get_filename_list``)."""
COMFYUI_FILE_INPUTS: Mapping[str, str] = {
    **COMFYUI_INPUTS,
    "unet_name": "unet",
    "clip_name": "clip",
    "control_net_name": "controlnet",
}
"""Every ComfyUI input that names a model file: a refusal of one of these is a file the
backend lacks (nodes do not report the last three folders, so jobs are not routed by them)."""

MAX_MODELS = 32
"""A job names at most this many models: a checkpoint and a handful of LoRAs is the norm."""

LISTED_CHARS = 300
"""The names a lacking failure lists, as JSON, fit in this many characters (the server
keeps 500 of an attempt's error)."""

_A1111_LORA = re.compile(r"<lora:([^:>]+)(?::[^>]*)?>")
"""The webui's extra-network syntax for LoRAs: ``<lora:name:weight>`` in the prompt."""
_MARK = "models missing on this node: "


def named(kind: str, name: str) -> str:
    """``name`` as the inventory spells a model of ``kind`` (``""`` or ``checkpoint``: bare)."""
    return f"{kind}:{name}" if kind in PREFIXED else name


def is_checkpoint(name: str) -> bool:
    """A bare name (a checkpoint or a registry name), not one of a prefixed kind."""
    return name.split(":", 1)[0] not in PREFIXED if ":" in name else True


def job_models(backend: str | None, payload: Mapping[str, Any]) -> frozenset[str]:
    """The models a job's payload names for its backend (a ComfyUI graph's files, a webui
    prompt's LoRAs and VAE): what the scheduler routes by besides ``Job.model``."""
    if backend == "comfyui" and isinstance(payload.get("workflow"), Mapping):
        return frozenset(comfyui_models(payload["workflow"]))
    if backend == "a1111":
        return frozenset(a1111_models(payload))
    return frozenset()


def comfyui_models(workflow: Mapping[str, Any]) -> tuple[str, ...]:
    """Every model a ComfyUI graph (API format) loads, inventory-spelled, sorted."""
    found: set[str] = set()
    for node in workflow.values():
        inputs = node.get("inputs") if isinstance(node, Mapping) else None
        if not isinstance(inputs, Mapping):
            continue
        for key, kind in COMFYUI_INPUTS.items():
            value = inputs.get(key)
            if not isinstance(value, str) or not value:  # a link is a list: not a file name
                continue
            if kind == "vae" and "." not in value:
                continue  # VAELoader's decoders that are no file (taesd, pixel_space)
            found.add(named(kind, value))
    return tuple(sorted(found))


def a1111_models(request: Mapping[str, Any]) -> tuple[str, ...]:
    """The LoRAs a webui request's prompts name (``<lora:name:weight>``) and the VAE its
    ``override_settings.sd_vae`` picks, inventory-spelled, sorted."""
    found: set[str] = set()
    for key in ("prompt", "negative_prompt"):
        text = request.get(key)
        if isinstance(text, str):
            found.update(named("lora", m.strip()) for m in _A1111_LORA.findall(text))
    overrides = request.get("override_settings")
    vae = overrides.get("sd_vae") if isinstance(overrides, Mapping) else None
    if isinstance(vae, str) and vae and vae not in ("Automatic", "None"):
        found.add(named("vae", vae))
    return tuple(sorted(found))


def comfyui_lacks(node_errors: Mapping[str, Any]) -> tuple[str, ...]:
    """The model files a ComfyUI refusal (``node_errors`` of a 400) is about, when it is about
    nothing else: every error a ``value_not_in_list`` of a model file input. () when any
    error is of another kind (the graph is wrong on every node, not only on this one)."""
    found: set[str] = set()
    for entry in node_errors.values():
        errors = entry.get("errors") if isinstance(entry, Mapping) else None
        for err in errors if isinstance(errors, list) else [None]:
            extra = err.get("extra_info") if isinstance(err, Mapping) else None
            if not isinstance(err, Mapping) or not isinstance(extra, Mapping):
                return ()
            kind = COMFYUI_FILE_INPUTS.get(str(extra.get("input_name")))
            if err.get("type") != "value_not_in_list" or kind is None:
                return ()
            found.add(named(kind, str(extra.get("received_value"))))
    return tuple(sorted(found))


def lacking(backend: str, models: Iterable[str], detail: str = "") -> str:
    """The failure of work a backend refused for models it does not have (``lacked`` reads
    the names back). The list is cut to ``LISTED_CHARS``: the server keeps only the start
    of an attempt's error, and one name is enough to rule the node out."""
    names: list[str] = []
    for name in sorted(set(models)):
        if names and len(json.dumps([*names, name])) > LISTED_CHARS:
            break
        names.append(name[:LISTED_CHARS])
    return f"{backend}: {_MARK}{json.dumps(names)}" + (f" ({detail})" if detail else "")


def lacked(error: str) -> tuple[str, ...]:
    """The models a failure made with ``lacking`` names; () for any other error."""
    at = error.find(_MARK)
    if at < 0:
        return ()
    try:
        names, _ = json.JSONDecoder().raw_decode(error, at + len(_MARK))
    except ValueError:
        return ()
    if not isinstance(names, list):
        return ()
    return tuple(str(n) for n in names)
