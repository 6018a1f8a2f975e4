"""The reference ComfyUI's output cache, as ComfyUI's default ("classic") cache behaves.

ComfyUI (``comfy_execution/caching.py``, ``execution.py``) keys each node's outputs
by its input signature: its class, its literal inputs (all of them, known to the
node or not) and, for linked inputs, the signatures of the nodes they come from.
A node whose signature is cached does not run: no ``executing``, no progress, no
preview; an output node that is cached sends ``executed`` with the output it had
(pointing at the files it saved then, which may have been deleted since), and the
history lists that output again. After each prompt only the current prompt's
nodes stay cached (``clean_unused``), so running A, B, A runs A twice.
``/free`` with ``free_memory`` empties it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Entry:
    """A node's cached outputs, and (an output node) what it showed: its ``ui``."""

    outputs: tuple[Any, ...]
    ui: dict[str, Any] | None = None


IsChanged = Callable[[Any], Any]


@dataclass
class OutputCache:
    entries: dict[str, Entry] = field(default_factory=dict)

    def signatures(
        self, prompt: Mapping[str, Any], changed: IsChanged = lambda node: None
    ) -> dict[str, str]:
        """Every node's signature in ``prompt`` (a text: equal texts, equal work);
        ``changed`` is a node's ``IS_CHANGED`` (ComfyUI adds it to the signature)."""
        found: dict[str, str] = {}
        for node_id in prompt:
            _signature(prompt, str(node_id), found, set(), changed)
        return found

    def get(self, signature: str) -> Entry | None:
        return self.entries.get(signature)

    def put(self, signature: str, entry: Entry) -> None:
        self.entries[signature] = entry

    def keep_only(self, signatures: Mapping[str, str]) -> None:
        """ComfyUI's ``clean_unused``: forget what the current prompt did not use."""
        used = set(signatures.values())
        self.entries = {k: v for k, v in self.entries.items() if k in used}

    def clear(self) -> None:
        self.entries.clear()


def _signature(
    prompt: Mapping[str, Any],
    node_id: str,
    found: dict[str, str],
    seen: set[str],
    changed: IsChanged,
) -> str:
    if node_id in found:
        return found[node_id]
    if node_id in seen or node_id not in prompt:
        return f"missing:{node_id}"  # a cycle or a dangling link: never equal to real work
    seen.add(node_id)
    node = prompt[node_id]
    inputs = node.get("inputs") or {}
    parts: list[Any] = [node.get("class_type"), changed(node)]
    for key in sorted(inputs):
        value = inputs[key]
        if isinstance(value, list) and len(value) == 2:
            value = ["link", _signature(prompt, str(value[0]), found, seen, changed), value[1]]
        parts.append([key, value])
    # a digest, not the text: a text holding its inputs' texts doubles its escaping at each
    # link, and a long chain (a sampler split in segments) would grow past any memory
    text = json.dumps(parts, sort_keys=True, default=str)
    found[node_id] = hashlib.sha256(text.encode()).hexdigest()
    return found[node_id]
