"""The certificate the server's two ports serve: given, made at first start, or none.

``server_tls(settings)`` decides (docs/security/tls.md):

* ``tls.cert`` and ``tls.key`` given: serve them (a CA's certificate, or
  your own).
* else ``tls.mode`` ``self-signed``, or ``auto`` with the server listening
  beyond this machine (``--host 0.0.0.0``): a self-signed certificate, made
  at first start under ``<home>/tls`` and kept (key owner-only), so its
  fingerprint, the pin agents and clients join with, stays the same.
* else (``off``, or ``auto`` on 127.0.0.1): plain http and grpc, as
  ``corral up`` and a reverse proxy on the same host want.

The HTTP API and the agent link serve the same certificate;
``agents.tls_cert`` / ``agents.tls_key`` still override it for the agent port.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from corral.core.errors import InvalidSpec
from corral.core.pins import Join, fingerprint_of
from corral.server.settings import Settings

CERT_FILE = "server.crt"
KEY_FILE = "server.key"
VALID_DAYS = 3650
"""Ten years: a pinned certificate is trusted by its digest, not its dates, and replacing it
means every agent joins again; rotate by deleting the files (docs/security/tls.md)."""

COMMON_NAME = "corral server"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The certificate in use and what clients pin."""

    cert: Path
    key: Path
    fingerprint: str  # sha256:<hex> of the (first) certificate served
    self_signed: bool  # no CA vouches for it: agents and clients need the fingerprint
    made: bool = False  # made at this start

    def join(self, token: str) -> Join:
        """What an agent joins with: the token, pinned to this certificate if self-signed."""
        return Join(token, self.fingerprint if self.self_signed else None)


def join_for(
    tls: ServerTls | None, token: str, address: str | None, host: str | None
) -> tuple[str, str | None]:
    """The join string for ``token`` and the ``corral agent`` command that uses it.

    ``address`` is the agent link's (``grpcs://0.0.0.0:8471``); its host is
    replaced by ``host``, the name the caller reached the API by, which is the
    one a GPU machine can dial too. A caller on this machine (``localhost``)
    gets the link's own address, or this machine's name when the link
    listens on every address.
    """
    join = tls.join(token) if tls is not None else Join(token)
    if not address:
        return str(join), None
    parts = urlsplit(address)
    listens = parts.hostname or ""
    name = host or listens
    if is_loopback(name) and not is_loopback(listens):
        name = socket.gethostname() if listens in WILDCARDS else listens
    shown = f"[{name}]" if ":" in name else name
    return str(join), f"corral agent --server {parts.scheme}://{shown}:{parts.port} --join {join}"


def server_tls(settings: Settings) -> ServerTls | None:
    """The certificate both ports serve, or None for plain http and grpc."""
    tls = settings.tls
    if tls.cert or tls.key:
        if not (tls.cert and tls.key):
            raise InvalidSpec(
                "tls.cert", "give tls.cert and tls.key together (--tls-cert, --tls-key)"
            )
        if tls.mode != "auto":
            raise InvalidSpec("tls.mode", f"{tls.mode!r} contradicts the tls.cert given")
        return load(tls.cert.expanduser(), tls.key.expanduser())
    if tls.mode == "off" or (tls.mode == "auto" and listens_locally(settings)):
        return None
    return self_signed(settings.resolved_home() / "tls", names(settings))


def apply(settings: Settings) -> ServerTls | None:
    """``server_tls``, and the agent port set to serve the same certificate unless told."""
    chosen = server_tls(settings)
    agents = settings.agents
    if chosen is not None and agents.tls_cert is None and agents.tls_key is None:
        agents.tls_cert, agents.tls_key = chosen.cert, chosen.key
    return chosen


def listens_locally(settings: Settings) -> bool:
    """Both ports bind loopback addresses only: nothing off this machine can reach them."""
    hosts = {settings.api.host}
    if settings.agents.enabled:
        hosts.add(settings.agents.host or settings.api.host)
    return all(is_loopback(h) for h in hosts)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def names(settings: Settings) -> list[str]:
    """What the self-signed certificate lists: this machine's names and the configured ones."""
    found = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
    for host in (settings.api.host, settings.agents.host or ""):
        if host.strip("[]") not in WILDCARDS:
            found.append(host.strip("[]"))
    found += settings.tls.names
    return list(dict.fromkeys(n for n in found if n))


def load(cert: Path, key: Path) -> ServerTls:
    """Given files, checked now so a mistake stops the start with the setting's name."""
    try:
        pem = cert.read_bytes()
        key.read_bytes()
        first = x509.load_pem_x509_certificate(pem)
    except OSError as exc:
        raise InvalidSpec("tls.cert", f"cannot read {exc.filename}: {exc.strerror}") from None
    except ValueError as exc:
        raise InvalidSpec("tls.cert", f"{cert} is not a PEM certificate: {exc}") from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise InvalidSpec("tls.key", f"{key} does not match {cert}: {exc}") from None
    der = first.public_bytes(serialization.Encoding.DER)
    return ServerTls(cert, key, fingerprint_of(der), first.issuer == first.subject)


def self_signed(folder: Path, hosts: list[str]) -> ServerTls:
    """The certificate kept in ``folder``, made there first if it is not yet."""
    cert, key = folder / CERT_FILE, folder / KEY_FILE
    if cert.exists() and key.exists():
        return load(cert, key)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    private = ec.generate_private_key(ec.SECP256R1())
    _write(
        key,
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    _write(cert, _certificate(private, hosts).public_bytes(serialization.Encoding.PEM))
    return replace(load(cert, key), made=True)


def _certificate(private: ec.EllipticCurvePrivateKey, hosts: list[str]) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # clients whose clocks lag a bit
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([_general(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(private, hashes.SHA256())
    )


def _general(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write(path: Path, data: bytes) -> None:
    """Write owner-only, whole or not at all (a crash leaves no half file behind)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
