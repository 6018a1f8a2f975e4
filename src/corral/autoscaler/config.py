"""Pools as users write them (YAML or JSON, already parsed), checked field by field.

::

    pools:
      - name: a100           # members are named a100-<random>
        gpus: 8              # per machine
        gpu_model: A100
        vram: 80GiB          # per GPU ("24GiB", or bytes)
        cpus: 64
        labels: {rack: r1}
        backends: [python]   # executors its agents offer (omit: any job's)
        min_nodes: 0
        max_nodes: 4
        cost_per_hour: 20.0  # the pool that fits a job cheapest per GPU is chosen
        max_spend_per_hour: 60.0  # its machines together cost at most this (omit: no cap)
        provider: cloud      # a name under providers: (omit when there is one provider)

A mistake names its place (``pools[1].vram: not a size: 'lots'``); unknown
keys are refused so a typo (``max_node``) does not silently mean the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.autoscaler.api import Pool
from corral.core.errors import InvalidSpec
from corral.core.resources import parse_bytes

_KEYS = frozenset(
    {"name", "gpus", "gpu_model", "vram", "cpus", "labels", "backends"}
    | {"min_nodes", "max_nodes", "cost_per_hour", "max_spend_per_hour", "provider"}
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def pools_from_json(document: Any) -> tuple[Pool, ...]:
    """The pools of ``{"pools": [...]}`` (or of a bare list), in the order given."""
    items = document.get("pools") if isinstance(document, Mapping) else document
    if not isinstance(items, list) or not items:
        raise InvalidSpec("pools", "must be a non-empty list of pools")
    pools = tuple(_pool(item, f"pools[{i}]") for i, item in enumerate(items))
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise InvalidSpec("pools", f"names must be unique, got {names}")
    return pools


def _pool(item: Any, where: str) -> Pool:
    if not isinstance(item, Mapping):
        raise InvalidSpec(where, "must be a mapping of pool fields")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise InvalidSpec(
            f"{where}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(_KEYS))})"
        )
    name = item.get("name")
    if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
        raise InvalidSpec(f"{where}.name", "must be lower-case letters, digits and '-'")
    provider = item.get("provider", "")
    if not isinstance(provider, str):
        raise InvalidSpec(f"{where}.provider", "must be the name of a provider")
    cap = item.get("max_spend_per_hour")
    labels = item.get("labels") or {}
    backends = item.get("backends") or []
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise InvalidSpec(f"{where}.labels", "must map names to strings")
    if not isinstance(backends, list) or not all(isinstance(b, str) for b in backends):
        raise InvalidSpec(f"{where}.backends", "must be a list of executor names")
    return Pool(
        name=name,
        gpus=_number(item, "gpus", where, 0),
        gpu_model=str(item.get("gpu_model", "")),
        vram_bytes=parse_bytes(item.get("vram", 0), field_name=f"{where}.vram"),
        cpus=_number(item, "cpus", where, 1),
        labels=dict(labels),
        backends=frozenset(backends),
        min_nodes=_number(item, "min_nodes", where, 0),
        max_nodes=_number(item, "max_nodes", where, 10),
        cost_per_hour=float(_number(item, "cost_per_hour", where, 0, kind=float)),
        provider=provider,
        max_spend_per_hour=None
        if cap is None
        else float(_number(item, "max_spend_per_hour", where, 0, kind=float)),
    )


def _number(item: Mapping[str, Any], key: str, where: str, default: int, kind: type = int) -> Any:
    value = item.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidSpec(f"{where}.{key}", f"must be a number >= 0, got {value!r}")
    if kind is int and value != int(value):
        raise InvalidSpec(f"{where}.{key}", f"must be a whole number, got {value!r}")
    return kind(value)
