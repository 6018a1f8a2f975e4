"""How the HTTP app is served: uvicorn, with the limits and the log hygiene of a public server.

``uvicorn_config`` is the one place ``corral server`` and ``corral up`` build
uvicorn's config. It adds:

* the guarded HTTP protocol (``httpguard.py``): header and body timeouts, a
  header size limit and a connection limit, from ``ApiSettings``;
* a websocket protocol whose refusals (the ComfyUI ``/ws`` without a valid
  token) close cleanly: uvicorn's websockets-sansio protocol logs an ERROR
  after every denial response (Kludex/uvicorn PR #3138, open upstream);
* redaction of secrets in uvicorn's log lines: a websocket's path is logged
  with its query string, and browsers can only send a token there (``?token=``).
"""

from __future__ import annotations

import logging
import re
import resource
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from corral.server.httpguard import HttpLimits, guarded_protocol
from corral.server.settings import ApiSettings

if TYPE_CHECKING:
    from uvicorn._types import ASGISendEvent

DESCRIPTOR_SHARE = 2
"""HTTP connections may take at most 1/2 of the process's descriptors: the rest stay for
agents' gRPC streams, the database pool, uploads and blobs."""
MIN_CONNECTIONS = 16
"""Even under a tiny descriptor limit, a few clients (and the health check) get in."""
ALL_ADDRESSES: frozenset[str] = frozenset({"*"})
"""``*`` in ``forwarded_allow_ips``: every address may be a proxy (see ``trusted_proxies``)."""
REDACTED_LOGGERS = ("uvicorn.error", "uvicorn.access")
"""The loggers that write request paths (websocket handshakes at INFO, the access log)."""


def uvicorn_config(app: Any, api: ApiSettings, **options: Any) -> uvicorn.Config:
    """uvicorn's config for ``app`` with corral's protocols; ``options`` go to uvicorn as is."""
    config = uvicorn.Config(app, ws=DeniableWebSocket, **options)
    config.http = guarded_protocol(http_limits(api, trusted_proxies(config)))  # read at load
    redact_logs()  # after Config: it (re)configures uvicorn's loggers
    return config


def http_limits(api: ApiSettings, proxies: frozenset[str] = frozenset()) -> HttpLimits:
    """The protocol's limits; ``max_connections`` fitted to the descriptors the process has."""
    return HttpLimits(
        header_timeout_s=api.header_timeout_s,
        body_timeout_s=api.body_timeout_s,
        min_body_bytes_per_s=api.min_body_bytes_per_s,
        max_header_bytes=api.max_header_bytes,
        max_connections=min(api.max_connections, descriptor_share()),
        max_connections_per_address=api.max_connections_per_address,
        proxies=proxies,
    )


def trusted_proxies(config: uvicorn.Config) -> frozenset[str]:
    """The addresses uvicorn trusts as proxies (``forwarded_allow_ips``): each carries many
    clients, so none is held to the per-address connection limit. Networks given there
    (``10.0.0.0/8``) are not expanded; ``*`` trusts every address, so none is held to it."""
    given = config.forwarded_allow_ips
    items = given.split(",") if isinstance(given, str) else list(given or ())
    addresses = frozenset(item.strip() for item in items if item.strip())
    return ALL_ADDRESSES if "*" in addresses else addresses


def descriptor_share() -> int:
    """The connections this process's descriptor limit leaves room for."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2**31 - 1
    return max(MIN_CONNECTIONS, soft // DESCRIPTOR_SHARE)


class DeniableWebSocket(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, with a denial response counted as a finished
    handshake (as its wsproto protocol does), so a refused websocket is not an ERROR."""

    async def send(self, message: ASGISendEvent) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True


# ---- secrets in logs ------------------------------------------------------------------------

_SECRET_PARAM = re.compile(
    r"(?i)([?&;](?:token|access_token|api_key|apikey|key|password|passwd|secret|auth)=)[^&;\s\"']*"
)
_CREDENTIALS = re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s\"',;]+")
_CORRAL_TOKEN = re.compile(r"\bcorral_(admin|team|agent)_[A-Za-z0-9_-]+")
REDACTED = "[redacted]"


def redact(text: str) -> str:
    """``text`` with query secrets, Authorization credentials and corral tokens masked."""
    text = _SECRET_PARAM.sub(rf"\1{REDACTED}", text)
    text = _CREDENTIALS.sub(rf"\1\2{REDACTED}", text)
    return _CORRAL_TOKEN.sub(rf"corral_\1_{REDACTED}", text)


class RedactSecrets(logging.Filter):
    """Masks secrets in a record's message and in each of its arguments, keeping the
    arguments' places (uvicorn's access formatter reads them by position)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def redact_logs() -> None:
    """Put ``RedactSecrets`` on the loggers that write request paths (once)."""
    for name in REDACTED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())
