"""Certificate pins: how agents and clients trust a server whose certificate no CA signed.

A server that makes its own (self-signed) certificate prints its SHA-256
fingerprint, ``sha256:<64 hex digits>``, the same digest ``openssl x509
-noout -fingerprint -sha256`` shows. A client given that fingerprint first
reads the certificate the server presents (a TLS handshake that sends
nothing), compares its digest with the pin, and only then connects for real
with that one certificate as its sole trusted root. So no CA is needed, and
a machine in between, which cannot present the pinned certificate with its
key, is refused before any token is sent.

A join string carries the pin and the agent token in one piece, as k3s's
join tokens carry their CA hash: ``sha256:<hex>::<token>``. A plain token
(no ``::``) is a join string without a pin.

Standard library only: the server, the agent and the SDK all use it.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import socket
import ssl
from dataclasses import dataclass

from corral.core.errors import CorralError, InvalidSpec

ALGORITHM = "sha256"
JOIN_SEPARATOR = "::"
FETCH_TIMEOUT_S = 10.0
"""Reading the server's certificate is one handshake; past this the server is taken as down."""

_HEX = re.compile(r"[0-9a-f]{64}")


class CertificateMismatch(CorralError):
    """The server presented a certificate other than the pinned one: not connecting."""

    def __init__(self, where: str, expected: str, seen: str) -> None:
        super().__init__(
            f"{where} presented a certificate with fingerprint {seen}, but the pin expects "
            f"{expected}: not connecting (a different server, or someone in between; if the "
            f"server's certificate was replaced on purpose, use the fingerprint it prints now)"
        )
        self.where = where
        self.expected = expected
        self.seen = seen


def fingerprint_of(der: bytes) -> str:
    """``sha256:<hex>`` of a certificate in DER form."""
    return f"{ALGORITHM}:{hashlib.sha256(der).hexdigest()}"


def parse_fingerprint(text: str, field: str = "ca_fingerprint") -> str:
    """A fingerprint as ``sha256:<lowercase hex>``; accepts openssl's ``AB:CD:..`` form too."""
    body = text.strip()
    algorithm, sep, rest = body.partition(":")
    if sep and algorithm.lower() == ALGORITHM:
        body = rest
    digits = body.replace(":", "").lower()
    if not _HEX.fullmatch(digits):
        raise InvalidSpec(field, f"{text!r} is not a SHA-256 fingerprint: write sha256:<64 hex>")
    return f"{ALGORITHM}:{digits}"


@dataclass(frozen=True, slots=True)
class Join:
    """What an agent needs to join: its token, and the server certificate's pin if any."""

    token: str
    fingerprint: str | None = None

    def __str__(self) -> str:
        if self.fingerprint is None:
            return self.token
        return f"{self.fingerprint}{JOIN_SEPARATOR}{self.token}"


def parse_join(text: str, field: str = "join") -> Join:
    """``sha256:<hex>::<token>`` or a plain token."""
    pin, sep, token = text.strip().rpartition(JOIN_SEPARATOR)
    if not sep:
        return Join(token)
    if not token:
        raise InvalidSpec(field, "the join string has no token after '::'")
    return Join(token, parse_fingerprint(pin, field))


def check(der: bytes, expected: str, where: str) -> None:
    """Raise ``CertificateMismatch`` unless ``der`` is the pinned certificate."""
    seen = fingerprint_of(der)
    if seen != expected:
        raise CertificateMismatch(where, expected, seen)


def fetch_certificate(host: str, port: int, timeout_s: float = FETCH_TIMEOUT_S) -> bytes:
    """The certificate ``host:port`` presents (DER), unverified: the caller checks the pin."""
    with (
        socket.create_connection((host, port), timeout=timeout_s) as raw,
        _unverified().wrap_socket(raw, server_hostname=host) as tls,
    ):
        return _peer(tls.getpeercert(binary_form=True))


async def fetch_certificate_async(
    host: str, port: int, timeout_s: float = FETCH_TIMEOUT_S
) -> bytes:
    """``fetch_certificate`` for asyncio code."""
    async with asyncio.timeout(timeout_s):
        _, writer = await asyncio.open_connection(
            host, port, ssl=_unverified(), server_hostname=host
        )
    try:
        tls = writer.get_extra_info("ssl_object")
        return _peer(None if tls is None else tls.getpeercert(binary_form=True))
    finally:
        writer.close()


def pinned_context(der: bytes) -> ssl.SSLContext:
    """A client context that trusts this one certificate and nothing else.

    The host name is not checked: the pin names the server, whatever name or
    address it was dialled by (a self-signed certificate rarely lists the
    VPS's public name).
    """
    context = ssl.create_default_context(cadata=ssl.DER_cert_to_PEM_cert(der))
    context.check_hostname = False
    return context


def _unverified() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only to read the certificate; the pin decides
    return context


def _peer(der: bytes | None) -> bytes:
    if not der:
        raise ssl.SSLError("the server presented no certificate")
    return der
