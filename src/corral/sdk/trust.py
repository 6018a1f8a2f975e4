"""Trusting an ``https://`` server whose certificate no public CA signed.

Two ways, besides the system's CAs (docs/security/tls.md):

* ``ca_fingerprint`` (``CORRAL_CA_FINGERPRINT``, ``corral login
  --ca-fingerprint``): the ``sha256:...`` the server prints. Before the
  first request the client reads the certificate the server presents,
  compares it with the pin (``corral.core.pins``) and then trusts that
  certificate alone; no request, and so no token, goes to another server.
* ``ca_cert`` (``CORRAL_CA_CERT``, ``--ca-cert``): a PEM file of the CA (or
  of the server's own certificate), checked with its host names as usual.

A pin that does not match raises ``UntrustedServer`` naming both fingerprints.
"""

from __future__ import annotations

import asyncio
import ssl
import threading

import httpx

from corral.core.pins import (
    CertificateMismatch,
    check,
    fetch_certificate,
    fetch_certificate_async,
    pinned_context,
)
from corral.sdk.errors import ClientError, UntrustedServer


def sync_transport(fingerprint: str | None, ca_cert: str | None) -> httpx.BaseTransport | None:
    """The transport that applies the trust asked for; None: httpx's (the system's CAs)."""
    if fingerprint:
        return PinnedTransport(fingerprint)
    if ca_cert:
        return httpx.HTTPTransport(verify=ca_context(ca_cert))
    return None


def async_transport(
    fingerprint: str | None, ca_cert: str | None
) -> httpx.AsyncBaseTransport | None:
    """``sync_transport`` for the asyncio client."""
    if fingerprint:
        return AsyncPinnedTransport(fingerprint)
    if ca_cert:
        return httpx.AsyncHTTPTransport(verify=ca_context(ca_cert))
    return None


def ca_context(path: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise ClientError(f"cannot use the CA file {path} (CORRAL_CA_CERT): {exc}") from None


class PinnedTransport(httpx.BaseTransport):
    """Sends requests only once the server has shown the pinned certificate."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self._inner: httpx.HTTPTransport | None = None
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            if self._inner is None:
                der = _fetched(request)
                self._inner = httpx.HTTPTransport(verify=_pinned(der, self.fingerprint, request))
        return self._inner.handle_request(request)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()


class AsyncPinnedTransport(httpx.AsyncBaseTransport):
    """``PinnedTransport`` for asyncio."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self._inner: httpx.AsyncHTTPTransport | None = None
        self._lock = asyncio.Lock()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        async with self._lock:
            if self._inner is None:
                host, port = _where(request)
                try:
                    der = await fetch_certificate_async(host, port)
                except (OSError, TimeoutError) as exc:
                    raise httpx.ConnectError(_reason(exc), request=request) from None
                verify = _pinned(der, self.fingerprint, request)
                self._inner = httpx.AsyncHTTPTransport(verify=verify)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        if self._inner is not None:
            await self._inner.aclose()


def _fetched(request: httpx.Request) -> bytes:
    host, port = _where(request)
    try:
        return fetch_certificate(host, port)
    except (OSError, TimeoutError) as exc:  # as any connection failure: retried, then reported
        raise httpx.ConnectError(_reason(exc), request=request) from None


def _pinned(der: bytes, fingerprint: str, request: httpx.Request) -> ssl.SSLContext:
    where = f"{request.url.scheme}://{request.url.netloc.decode()}"
    try:
        check(der, fingerprint, where)
    except CertificateMismatch as exc:
        raise UntrustedServer(f"{exc} (CORRAL_CA_FINGERPRINT)") from None
    return pinned_context(der)


def _where(request: httpx.Request) -> tuple[str, int]:
    return request.url.host, request.url.port or 443


def _reason(exc: BaseException) -> str:
    return f"cannot read the server's certificate: {exc or type(exc).__name__}"
