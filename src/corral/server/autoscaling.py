"""The autoscaler's pieces built from settings: its pools (a YAML or JSON file) and its provider.

Mistakes stop ``corral server`` at start with a message naming the setting
(``autoscale.pools_file: cannot read pools.yaml: No such file``), never at
the first decision.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from corral.autoscaler import Pool, Provider
from corral.autoscaler.config import pools_from_json
from corral.core.errors import InvalidSpec
from corral.server.providers import CommandProvider, WebhookProvider
from corral.server.settings import AutoscaleSettings, Settings


def scaling_from(settings: Settings) -> tuple[Provider, tuple[Pool, ...]] | None:
    """The provider and pools to scale with; None when the autoscaler is off."""
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
    pools = load_pools(scaling.pools_file)
    return provider_from(scaling), pools


def load_pools(path: Path) -> tuple[Pool, ...]:
    try:
        text = path.expanduser().read_text()
    except OSError as e:
        raise InvalidSpec("autoscale.pools_file", f"cannot read {path}: {e.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidSpec("autoscale.pools_file", f"{path} is not YAML or JSON: {e}") from None
    try:
        return pools_from_json(document)
    except InvalidSpec as e:
        raise InvalidSpec(f"{path}: {e.field}", e.message) from None


def provider_from(settings: AutoscaleSettings) -> Provider:
    if bool(settings.command) == bool(settings.webhook_url):
        raise InvalidSpec(
            "autoscale.command",
            "set exactly one provider: a command (CORRAL_AUTOSCALE__COMMAND) or a webhook "
            "(CORRAL_AUTOSCALE__WEBHOOK_URL)",
        )
    timeout = settings.provider_timeout_s
    if settings.command:
        return CommandProvider(settings.command, timeout)
    token = settings.webhook_token.get_secret_value() if settings.webhook_token else None
    return WebhookProvider(settings.webhook_url, token, timeout)
