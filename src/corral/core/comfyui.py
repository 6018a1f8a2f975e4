"""ComfyUI's prompt validation, against a node catalog in ``/object_info``'s shape.

Both sides of corral speak ComfyUI's API: the reference ComfyUI the agent is tested
against, and the drop-in ``/prompt`` of the server. Both must answer a graph as
ComfyUI does, so both validate here. This mirrors ComfyUI's ``execution.py``
(``validate_prompt`` and ``validate_inputs``): every output node is validated with
the nodes it depends on; an output whose graph has an error is dropped and its
errors are reported per node in ``node_errors``; the prompt is refused
(``prompt_outputs_failed_validation``) only when no output is left, else it runs
the good outputs and ``/prompt`` answers 200 with the ``node_errors`` of the
others. Error ``type`` names, messages and details are ComfyUI's own. Inputs are
converted in place (``"64"`` becomes ``64`` for an INT) as ComfyUI does before
queueing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

MODEL_FOLDERS = (
    "checkpoints",
    "configs",
    "loras",
    "vae",
    "text_encoders",
    "diffusion_models",
    "clip_vision",
    "style_models",
    "embeddings",
    "diffusers",
    "vae_approx",
    "controlnet",
    "gligen",
    "upscale_models",
    "custom_nodes",
    "hypernetworks",
    "photomaker",
    "classifiers",
)
"""ComfyUI's model folders in the order ``folder_paths.folder_names_and_paths`` registers
them: what ``GET /models`` lists, on a ComfyUI and on the drop-in API."""

OUTPUTS_MANIFEST = "comfyui-outputs.json"
"""The result a ComfyUI job adds to its files: the prompt's history ``outputs``, each file
entry with the ``result`` it was saved as (so each file keeps its kind, node, subfolder)."""
MODEL_LISTS = frozenset(
    {"ckpt_name", "lora_name", "vae_name", "unet_name", "clip_name", "control_net_name"}
)
"""Inputs that choose a model file: each backend lists its own files."""
LONG_LIST = 20
"""ComfyUI names the choices of a refused enum value only up to this many (model lists
can be thousands long); longer lists read ``(list of length N)``."""
CONVERT: dict[str, type] = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": bool}
SELF_VALIDATED = {
    "LoadImage": ("image",),
    "LoadImageMask": ("image", "channel"),
    "LoadLatent": ("latent",),
}
"""Nodes that validate these inputs themselves (their ``VALIDATE_INPUTS``): ComfyUI then
skips the choice list of each (an image need not be in ``/object_info``'s list, which was
read before it was uploaded) and asks the node instead: is the file there, is the
channel one of the four."""
COLOR_CHANNELS = ("alpha", "red", "green", "blue")


@dataclass
class Validation:
    """The outcome: ``error`` None when some outputs are good (``outputs``); ``node_errors``
    says why the other outputs were dropped (ComfyUI then answers 200 with it)."""

    error: dict[str, Any] | None
    outputs: list[str] = field(default_factory=list)
    node_errors: dict[str, Any] = field(default_factory=dict)


class _Broken(Exception):
    """A graph ComfyUI's validation would crash on (a link to a missing node or slot);
    ``kind`` is the exception ComfyUI then reports (``KeyError``, ``IndexError``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def validate_prompt(
    prompt: Mapping[str, Any],
    info: Mapping[str, Any],
    *,
    unchecked_lists: Collection[str] = (),
    files: Callable[[str], bool] | None = None,
) -> Validation:
    """Validate ``prompt`` (API format) against ``info`` (``/object_info``).

    ``unchecked_lists`` names inputs whose choices are not checked (the drop-in's model
    lists, which are one node's and another node may have the model). ``files`` says
    whether an image a ``LoadImage`` names exists (None: any does).
    """
    outputs = []
    for node_id, node in prompt.items():
        if not isinstance(node, Mapping) or "class_type" not in node:
            message = "Cannot execute because a node is missing the class_type property."
            return Validation(error("invalid_prompt", message, f"Node ID '#{node_id}'"))
        kind = node["class_type"]
        if kind not in info:
            message = f"Cannot execute because node {kind} does not exist."
            return Validation(error("invalid_prompt", message, f"Node ID '#{node_id}'"))
        if info[kind].get("output_node") is True:
            outputs.append(str(node_id))
    if not outputs:
        return Validation(error("prompt_no_outputs", "Prompt has no outputs"))
    checker = _Checker(prompt, info, frozenset(unchecked_lists), files or (lambda _: True))
    return checker.outputs(outputs)


def error(kind: str, message: str, details: str = "") -> dict[str, Any]:
    """One error in ComfyUI's shape."""
    return {"type": kind, "message": message, "details": details, "extra_info": {}}


def describe(node_errors: Mapping[str, Any]) -> str:
    """``node_errors`` as one line a person reads: ``node #5 (EmptyLatentImage) input
    width: Value 0 smaller than min of 16``, one clause per error."""
    clauses = []
    for node_id, entry in node_errors.items():
        if not isinstance(entry, Mapping):
            continue
        for err in entry.get("errors") or []:
            name = (err.get("extra_info") or {}).get("input_name")
            where = f"node #{node_id} ({entry.get('class_type')})" + (
                f" input {name}" if name else ""
            )
            details = str(err.get("details") or "")
            reason = str(err.get("message", ""))
            if details and details != name:
                reason = f"{reason}: {details}"
            clauses.append(f"{where}: {reason}")
    return "; ".join(clauses)


class _Checker:
    """One validation pass; ``validated`` remembers each node's verdict (ComfyUI's cache)."""

    def __init__(
        self,
        prompt: Mapping[str, Any],
        info: Mapping[str, Any],
        skip: frozenset[str],
        files: Callable[[str], bool],
    ):
        self.prompt, self.info, self.skip, self.files = prompt, info, skip, files
        self.validated: dict[str, tuple[bool, list[dict[str, Any]]]] = {}

    def outputs(self, outputs: list[str]) -> Validation:
        good: list[str] = []
        failed: list[dict[str, Any]] = []
        node_errors: dict[str, Any] = {}
        for out in outputs:
            try:
                valid, reasons = self.node(out)
            except _Broken as exc:
                reasons = [_exception("exception_during_validation", "node", exc)]
                valid, self.validated[out] = False, (False, reasons)
            if valid:
                good.append(out)
                continue
            failed.extend(reasons)
            for node_id, (ok, why) in self.validated.items():
                # a node downstream of a bad one is invalid with no reasons: not listed
                if not ok and why:
                    entry = node_errors.setdefault(
                        node_id,
                        {
                            "errors": why,
                            "dependent_outputs": [],
                            "class_type": self.prompt[node_id]["class_type"],
                        },
                    )
                    entry["dependent_outputs"].append(out)
        if good:
            return Validation(None, good, node_errors)
        lines = "\n".join(f"{e['message']}: {e['details']}" for e in failed)
        message = "Prompt outputs failed validation"
        return Validation(
            error("prompt_outputs_failed_validation", message, lines), [], node_errors
        )

    def node(self, node_id: str) -> tuple[bool, list[dict[str, Any]]]:
        """ComfyUI's ``validate_inputs`` for one node (and, through links, its inputs')."""
        if node_id in self.validated:
            return self.validated[node_id]
        self.validated[node_id] = (True, [])  # a cycle is not followed round again
        node = self.prompt[node_id]
        inputs = node.get("inputs")
        inputs = inputs if isinstance(inputs, dict) else {}
        schema = self.info[node["class_type"]].get("input") or {}
        errors: list[dict[str, Any]] = []
        valid = True
        custom = SELF_VALIDATED.get(node["class_type"], ())
        for category in ("required", "optional"):
            for name, spec in (schema.get(category) or {}).items():
                if name not in inputs:
                    if category == "required":
                        errors.append(_missing(name))
                    continue
                kind, config = _spec(spec)
                if isinstance(inputs[name], list):
                    found, linked_ok = self._link(name, inputs[name], kind, config)
                    errors.extend(found)
                    valid = valid and linked_ok
                else:
                    listed = name not in custom
                    errors.extend(self._value(inputs, name, kind, config, listed=listed))
        if custom:
            errors.extend(self._custom(node["class_type"], inputs, custom))
        verdict = (not errors and valid, errors)
        self.validated[node_id] = verdict
        return verdict

    def _link(
        self, name: str, link: list[Any], kind: Any, config: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], bool]:
        """A linked input: its shape, the linked output's type, and that node's validity."""
        extra = {"input_name": name, "input_config": [kind, config]}
        if len(link) != 2:
            message = "Bad linked input, must be a length-2 list of [node_id, slot_index]"
            return [_input("bad_linked_input", message, name, extra, link)], True
        source = str(link[0])
        if source not in self.prompt:
            raise _Broken("KeyError", repr(source))  # ComfyUI's KeyError on the missing node
        outputs = self.info[self.prompt[source]["class_type"]].get("output") or []
        if not isinstance(link[1], int) or not 0 <= link[1] < len(outputs):
            raise _Broken("IndexError", "tuple index out of range")
        received = outputs[link[1]]
        if not _types_match(received, kind):
            details = f"{name}, received_type({received}) mismatch input_type({kind})"
            mismatch = {**extra, "received_type": received, "linked_node": link}
            found = error("return_type_mismatch", "Return type mismatch between linked nodes")
            return [{**found, "details": details, "extra_info": mismatch}], True
        try:
            linked_ok, _ = self.node(source)
        except _Broken as exc:
            reasons = [_exception("exception_during_inner_validation", "inner node", exc)]
            self.validated[source] = (False, reasons)
            return [], False
        return [], linked_ok

    def _custom(
        self, kind: str, inputs: dict[str, Any], names: tuple[str, ...]
    ) -> list[dict[str, Any]]:
        """ComfyUI's ``LoadImage``/``LoadImageMask.VALIDATE_INPUTS``: its one verdict is
        reported once for each of the inputs it takes (so a missing image of a
        ``LoadImageMask`` is two errors, ``image - ...`` and ``channel - ...``)."""
        what = "latent" if kind == "LoadLatent" else "image"
        image, reason = inputs.get(what), None
        if not isinstance(image, str) or not self.files(image):
            reason = f"Invalid {what} file: {image}"
        elif kind == "LoadImageMask" and inputs.get("channel") not in COLOR_CHANNELS:
            reason = f"Invalid color channel: {inputs.get('channel')}"
        if reason is None:
            return []
        failed = error("custom_validation_failed", "Custom validation failed for node")
        return [
            {**failed, "details": f"{name} - {reason}", "extra_info": {"input_name": name}}
            for name in names
            if name in inputs
        ]

    def _value(
        self,
        inputs: dict[str, Any],
        name: str,
        kind: Any,
        config: dict[str, Any],
        *,
        listed: bool = True,
    ) -> list[dict[str, Any]]:
        """A literal input: converted to its type, then its range or choices."""
        value = inputs[name]
        if isinstance(value, dict) and "__value__" in value:
            value = inputs[name] = value["__value__"]
        extra: dict[str, Any] = {"input_name": name, "input_config": [kind, config]}
        if isinstance(kind, str) and kind in CONVERT:
            try:
                value = inputs[name] = CONVERT[kind](value)
            except (TypeError, ValueError) as exc:
                message = f"Failed to convert an input value to a {kind} value"
                found = _input("invalid_input_type", message, name, extra, value)
                return [{**found, "details": f"{name}, {value}, {exc}"}]
        if name in self.skip:
            return []
        if "min" in config and _compare(value, config["min"]) < 0:
            message = f"Value {value} smaller than min of {config['min']}"
            return [_input("value_smaller_than_min", message, name, extra, value)]
        if "max" in config and _compare(value, config["max"]) > 0:
            message = f"Value {value} bigger than max of {config['max']}"
            return [_input("value_bigger_than_max", message, name, extra, value)]
        if listed and isinstance(kind, list) and value not in kind:
            shown = f"(list of length {len(kind)})" if len(kind) > LONG_LIST else str(kind)
            if len(kind) > LONG_LIST:
                extra = {**extra, "input_config": None}
            found = _input("value_not_in_list", "Value not in list", name, extra, value)
            return [{**found, "details": f"{name}: '{value}' not in {shown}"}]
        return []


def _spec(spec: Any) -> tuple[Any, dict[str, Any]]:
    """(type, config) of one input's spec: ``["INT", {"min": 1}]``, ``[[choices]]``, or the
    newer ``["COMBO", {"options": [...]}]``."""
    if not isinstance(spec, list) or not spec:
        return spec, {}
    kind = spec[0]
    config = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if kind == "COMBO" and isinstance(config.get("options"), list):
        kind = list(config["options"])
    return kind, config


def _types_match(received: Any, wanted: Any) -> bool:
    """ComfyUI's ``validate_node_input``: equal, or comma-separated type sets that overlap
    (``*`` is the any-type of custom nodes)."""
    if received == wanted or "*" in (received, wanted):
        return True
    if not isinstance(received, str) or not isinstance(wanted, str):
        return isinstance(wanted, list) and received in ("COMBO", wanted)
    return bool({t.strip() for t in received.split(",")} & {t.strip() for t in wanted.split(",")})


def _compare(value: Any, bound: Any) -> int:
    try:
        return -1 if value < bound else (1 if value > bound else 0)
    except TypeError:
        return 0


def _missing(name: str) -> dict[str, Any]:
    found = error("required_input_missing", "Required input is missing", name)
    return {**found, "extra_info": {"input_name": name}}


def _input(kind: str, message: str, name: str, extra: dict[str, Any], value: Any) -> dict[str, Any]:
    return {**error(kind, message, name), "extra_info": {**extra, "received_value": value}}


def _exception(kind: str, what: str, exc: _Broken) -> dict[str, Any]:
    found = error(kind, f"Exception when validating {what}", str(exc))
    return {**found, "extra_info": {"exception_type": exc.kind, "traceback": []}}
