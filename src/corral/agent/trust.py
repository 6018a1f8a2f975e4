"""How the agent trusts the server's TLS certificate, for the gRPC link and model downloads.

Three ways, from the join command (docs/security/tls.md):

* a pin (``--ca-fingerprint sha256:...``, or a join string that carries
  one): before each dial the agent reads the certificate the server
  presents and compares its digest with the pin (``corral.core.pins``); a
  mismatch ends the agent with both fingerprints named. The certificate then
  is the channel's only trusted root, so a self-signed server needs no CA;
* a CA file (``--ca-cert``): a private CA, with the usual host name check;
* neither: the system's CAs (a server with a certificate from a public CA).

Model files the server holds are fetched over HTTPS under the same trust:
requests to the host the agent dialled go through the pinned certificate;
other hosts (a model hub) through the system's CAs.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
from cryptography import x509
from cryptography.x509.oid import NameOID

from corral.core import InvalidSpec
from corral.core.pins import check, fetch_certificate_async, pinned_context

GrpcOptions = list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Pinned:
    """The pinned certificate, as the server at ``host`` presented it."""

    host: str
    der: bytes


class ServerTrust:
    """The agent's trust in its server: a pin, a CA file, or the system's CAs."""

    def __init__(self, fingerprint: str | None = None, ca_file: Path | None = None) -> None:
        if fingerprint and ca_file:
            raise InvalidSpec("ca_cert", "give a CA file or a fingerprint, not both")
        self.fingerprint = fingerprint
        self.ca_file = ca_file.expanduser() if ca_file else None
        self.pinned: Pinned | None = None

    async def credentials(self, address: str, where: str) -> tuple[object, GrpcOptions]:
        """Channel credentials for ``address`` (``host:port``), and the options they need.

        Raises ``CertificateMismatch`` when the server is not the pinned one.
        """
        if self.fingerprint:
            host, _, port = address.rpartition(":")
            der = await fetch_certificate_async(host.strip("[]"), int(port))
            check(der, self.fingerprint, where)
            self.pinned = Pinned(host.strip("[]"), der)
            pem = ssl.DER_cert_to_PEM_cert(der).encode()
            # The pin names the server: match whatever name its certificate lists.
            options = [("grpc.ssl_target_name_override", certificate_name(der))]
            return grpc.ssl_channel_credentials(root_certificates=pem), options
        if self.ca_file:
            return grpc.ssl_channel_credentials(root_certificates=self._ca_bytes()), []
        return grpc.ssl_channel_credentials(), []

    def explain(self, reason: str) -> str:
        """``reason`` a dial failed, with the way out when an unpinned certificate was refused."""
        if "CERTIFICATE_VERIFY_FAILED" in reason and not self.fingerprint:
            return f"{reason} (a self-signed server? pin it: --ca-fingerprint or --join)"
        return reason

    def http_transport(self) -> httpx.AsyncBaseTransport | None:
        """The model downloader's transport; None: httpx's own (the system's CAs)."""
        if self.fingerprint:
            return PinnedRoutes(self)
        if self.ca_file:
            return httpx.AsyncHTTPTransport(verify=self.system_context())
        return None

    def system_context(self) -> ssl.SSLContext:
        """The system's CAs, plus the CA file if one was given."""
        context = ssl.create_default_context()
        if self.ca_file:
            context.load_verify_locations(cadata=self._ca_bytes().decode())
        return context

    def _ca_bytes(self) -> bytes:
        assert self.ca_file is not None
        try:
            return self.ca_file.read_bytes()
        except OSError as exc:
            raise InvalidSpec("ca_cert", f"cannot read {self.ca_file}: {exc.strerror}") from None


class PinnedRoutes(httpx.AsyncBaseTransport):
    """Requests to the pinned server's host trust its certificate only; others the system's."""

    def __init__(self, trust: ServerTrust) -> None:
        self._trust = trust
        self._system = httpx.AsyncHTTPTransport()
        self._pinned: httpx.AsyncHTTPTransport | None = None  # made at the first use

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._route(request).handle_async_request(request)

    def _route(self, request: httpx.Request) -> httpx.AsyncBaseTransport:
        pinned = self._trust.pinned
        if pinned is None or request.url.host != pinned.host:
            return self._system
        if self._pinned is None:  # the pin fixes the certificate: one transport serves it
            self._pinned = httpx.AsyncHTTPTransport(verify=pinned_context(pinned.der))
        return self._pinned

    async def aclose(self) -> None:
        await self._system.aclose()
        if self._pinned is not None:
            await self._pinned.aclose()


def certificate_name(der: bytes) -> str:
    """A name the certificate answers to: its first DNS name, else address, else common name."""
    cert = x509.load_der_x509_certificate(der)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names = x509.SubjectAlternativeName([])
    dns = names.get_values_for_type(x509.DNSName)
    ips = names.get_values_for_type(x509.IPAddress)
    if dns:
        return dns[0]
    if ips:
        return str(ips[0])
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(common[0].value) if common else ""
