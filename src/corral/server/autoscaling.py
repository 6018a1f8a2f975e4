"""The autoscaler's pieces built from settings: its pools (a YAML or JSON file) and providers.

One provider comes from the settings (``autoscale.command`` or
``autoscale.webhook_url``) and serves the pools that name none. Several come
from a ``providers:`` section of the pools file, each pool naming its own::

    providers:
      cloud: {webhook_url: "https://cloud.example/corral", token_env: CLOUD_TOKEN}
      local: {command: "python examples/autoscale/local_provider.py"}
      home:  {fixed: [box-1, box-2]}     # machines you run: always there
    pools:
      - {name: g4090, provider: cloud, ...}
      - {name: cpu, provider: local, ...}
      - {name: home4090, provider: home, ...}

A webhook's token is read from the environment variable ``token_env`` names,
never from the file. A fixed set belongs to one pool (``Pool.fixed``), whose
``min_nodes`` and ``max_nodes`` become its size: the autoscaler counts those
machines as room for waiting work (and their cost), and never starts, drains
or stops one.

Mistakes stop ``corral server`` at start with a message naming the setting
(``autoscale.pools_file: cannot read pools.yaml: No such file``), never at
the first decision.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from corral.autoscaler import Pool, Provider
from corral.autoscaler.config import pools_from_json
from corral.core.errors import InvalidSpec
from corral.server.autoscale_settings import AutoscaleSettings
from corral.server.providers import CommandProvider, FixedProvider, WebhookProvider
from corral.server.settings import Settings

_PROVIDER_KEYS = frozenset({"command", "webhook_url", "token_env", "timeout_s", "fixed"})


def scaling_from(settings: Settings) -> tuple[dict[str, Provider], tuple[Pool, ...]] | None:
    """The providers (by name) and pools to scale with; None when the autoscaler is off."""
    scaling = settings.autoscale
    if scaling.pools_file is None:
        return None
    listens = settings.agents.host or settings.api.host
    if not scaling.agent_server and listens in ("0.0.0.0", "::", ""):
        raise InvalidSpec(
            "autoscale.agent_server",
            f"set it (e.g. grpc://vps.example.com:{settings.agents.port}): the agent link "
            f"listens on {listens or 'every address'}, which launched machines cannot dial",
        )
    document = read_pools_file(scaling.pools_file)
    pools = _checked(scaling.pools_file, document)
    named = _named(scaling.pools_file, document, scaling.provider_timeout_s)
    providers: dict[str, Provider] = dict(named)
    if any(p.provider == "" for p in pools) or not named:
        providers[""] = provider_from(scaling)
    pools = tuple(_fitted(pool, providers, scaling.pools_file) for pool in pools)
    return providers, pools


def load_pools(path: Path) -> tuple[Pool, ...]:
    return _checked(path, read_pools_file(path))


def read_pools_file(path: Path) -> Any:
    try:
        text = path.expanduser().read_text()
    except OSError as e:
        raise InvalidSpec("autoscale.pools_file", f"cannot read {path}: {e.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidSpec("autoscale.pools_file", f"{path} is not YAML or JSON: {e}") from None


def provider_from(settings: AutoscaleSettings) -> Provider:
    if bool(settings.command) == bool(settings.webhook_url):
        raise InvalidSpec(
            "autoscale.command",
            "set exactly one provider: a command (CORRAL_AUTOSCALE__COMMAND) or a webhook "
            "(CORRAL_AUTOSCALE__WEBHOOK_URL), or name each pool's under providers: in the "
            "pools file",
        )
    timeout = settings.provider_timeout_s
    if settings.command:
        return CommandProvider(settings.command, timeout)
    token = settings.webhook_token.get_secret_value() if settings.webhook_token else None
    return WebhookProvider(settings.webhook_url, token, timeout)


def _checked(path: Path, document: Any) -> tuple[Pool, ...]:
    try:
        return pools_from_json(document)
    except InvalidSpec as e:
        raise InvalidSpec(f"{path}: {e.field}", e.message) from None


def _named(path: Path, document: Any, timeout: float) -> dict[str, Provider]:
    """The ``providers:`` section, by name (empty when there is none)."""
    section = document.get("providers") if isinstance(document, Mapping) else None
    if section is None:
        return {}
    if not isinstance(section, Mapping) or not section:
        raise InvalidSpec(f"{path}: providers", "must map provider names to their settings")
    return {str(name): _one(path, str(name), spec, timeout) for name, spec in section.items()}


def _one(path: Path, name: str, spec: Any, timeout: float) -> Provider:
    where = f"{path}: providers.{name}"
    if not name or not isinstance(spec, Mapping):
        raise InvalidSpec(where, "must be a mapping with command, webhook_url or fixed")
    unknown = sorted(set(spec) - _PROVIDER_KEYS)
    if unknown:
        known = ", ".join(sorted(_PROVIDER_KEYS))
        raise InvalidSpec(f"{where}.{unknown[0]}", f"unknown field (known: {known})")
    kinds = [k for k in ("command", "webhook_url", "fixed") if spec.get(k)]
    if len(kinds) != 1:
        raise InvalidSpec(where, "set exactly one of command, webhook_url and fixed")
    timeout = spec.get("timeout_s", timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise InvalidSpec(f"{where}.timeout_s", f"must be a number > 0, got {timeout!r}")
    if kinds == ["command"]:
        return CommandProvider(str(spec["command"]), float(timeout))
    if kinds == ["webhook_url"]:
        env = spec.get("token_env")
        token = os.environ.get(str(env)) if env else None
        if env and not token:
            raise InvalidSpec(f"{where}.token_env", f"the environment has no {env}")
        return WebhookProvider(str(spec["webhook_url"]), token, float(timeout))
    names = spec["fixed"]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise InvalidSpec(f"{where}.fixed", "must be a list of machine (node) names")
    if len(set(names)) != len(names):
        raise InvalidSpec(f"{where}.fixed", "names a machine twice")
    return FixedProvider("", names)  # its pool is set once the pools are read (_fitted)


def _fitted(pool: Pool, providers: Mapping[str, Provider], path: Path) -> Pool:
    """``pool`` checked against its provider; a fixed set's pool is exactly its size."""
    provider = providers.get(pool.provider)
    if provider is None:
        known = ", ".join(sorted(repr(n) for n in providers)) or "none"
        raise InvalidSpec(
            f"{path}: pools[{pool.name}].provider",
            f"no provider named {pool.provider!r} (known: {known})",
        )
    if not isinstance(provider, FixedProvider):
        return pool
    if provider.pool and provider.pool != pool.name:
        raise InvalidSpec(
            f"{path}: pools[{pool.name}].provider",
            f"the fixed set {pool.provider!r} already belongs to pool {provider.pool}",
        )
    provider.pool = pool.name
    size = len(provider.names)
    return dataclasses.replace(pool, min_nodes=size, max_nodes=size, fixed=True)
