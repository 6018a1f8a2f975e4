"""Which sources the model registry accepts: the server must not publish its own files, and
agents must not be sent to fetch from private networks.

A registered model is downloadable by every token (agents fetch it), so a
source is a publication:

* a **file on the server** is served at ``/v1/models/{name}/file``: it must
  lie under ``models.file_dirs`` (default: the model directory), checked with
  symlinks resolved when it is registered and again each time it is served
  (a link swapped in later is caught);
* an **http(s) URL** is handed to agents, who fetch it from their own
  network: its host must not be, nor resolve (from the server) to, a private,
  loopback, link-local or otherwise non-public address, such as the cloud
  metadata service at 169.254.169.254, unless that address lies in
  ``models.allowed_networks`` (e.g. a NAS on the LAN). The server never
  fetches these URLs itself, so the check is made here, at registration; a
  host the server cannot resolve is left to the agents (it may be a name of
  their network), and what a name resolves to when an agent fetches it (DNS
  rebinding) is the agent's network's concern;
* ``models.source_schemes`` narrows the kinds further (e.g. https only).

Refusals are ``InvalidSpec`` naming the source's index and the setting.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from corral.core.errors import Forbidden, InvalidSpec
from corral.server.settings import Settings
from corral.server.store.models import UPLOAD

RESOLVE_TIMEOUT_S = 5.0
"""A registration waits this long for DNS at most; a host still unknown is left to agents."""

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    """The allowed schemes, the directories server files may be in, and the non-public
    networks sources may still point into."""

    schemes: frozenset[str]
    file_dirs: tuple[Path, ...]
    networks: tuple[Network, ...]

    @classmethod
    def of(cls, settings: Settings) -> SourcePolicy:
        models = settings.models
        dirs = tuple(d.expanduser() for d in models.file_dirs) or (settings.model_path(),)
        return cls(
            schemes=frozenset(s.lower() for s in models.source_schemes),
            file_dirs=tuple(d.resolve() for d in dirs),
            networks=tuple(models.allowed_networks),
        )

    async def check(self, sources: tuple[str, ...]) -> None:
        """Refuse the first source the policy does not allow (``sources`` as normalised by
        ``check_sources``: server files are absolute paths)."""
        for i, source in enumerate(sources):
            field = f"sources[{i}]"
            if source == UPLOAD:
                continue
            if source.startswith("/"):
                self._check_scheme(field, source, "file")
                self.check_file(field, source)
                continue
            self._check_scheme(field, source, urlsplit(source).scheme.lower())
            await self._check_host(field, source)

    def check_file(self, field: str, path: str) -> None:
        """``path``, symlinks resolved, must be inside one of ``file_dirs``."""
        if not self.serves(path):
            dirs = ", ".join(str(d) for d in self.file_dirs)
            raise InvalidSpec(
                field,
                f"{path} is outside the directories model files may be served from "
                f"({dirs}; set models.file_dirs)",
            )

    def serves(self, path: str) -> bool:
        real = Path(path).resolve()
        return any(real.is_relative_to(d) for d in self.file_dirs)

    def check_served(self, name: str, path: str) -> None:
        """At download time: a file that left the allowed directories is not served."""
        if not self.serves(path):
            raise Forbidden(
                f"model {name}'s file is outside the directories model files may be served "
                "from (models.file_dirs): it is not served"
            )

    def _check_scheme(self, field: str, source: str, scheme: str) -> None:
        if scheme not in self.schemes:
            allowed = ", ".join(sorted(self.schemes)) or "none"
            raise InvalidSpec(
                field,
                f"{source!r}: {scheme} sources are not allowed here "
                f"(models.source_schemes: {allowed})",
            )

    async def _check_host(self, field: str, source: str) -> None:
        host = urlsplit(source).hostname or ""
        for address in await _addresses(host):
            if not _public(address) and not any(address in n for n in self.networks):
                raise InvalidSpec(
                    field,
                    f"{source!r}: {host} is {address}, a private, loopback, link-local or "
                    "reserved address; agents are not sent there unless it is in "
                    "models.allowed_networks",
                )


async def _addresses(host: str) -> list[Address]:
    """Every address ``host`` is or resolves to (none when it cannot be resolved)."""
    try:
        return [_unmapped(ipaddress.ip_address(host))]
    except ValueError:
        pass  # a name, or a numeric form only the resolver reads (2852039166, 0x7f.1)
    loop = asyncio.get_running_loop()
    try:
        found = await asyncio.wait_for(
            loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError, UnicodeError):
        return []
    return [_unmapped(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])) for info in found]


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""The well-known NAT64 prefix: its addresses reach the IPv4 address in their last 32 bits."""


def _unmapped(address: Address) -> Address:
    """An IPv4 address written as IPv6 (mapped ``::ffff:a.b.c.d``, 6to4, NAT64) is judged as
    the IPv4 address it reaches."""
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _public(address: Address) -> bool:
    return address.is_global and not address.is_multicast
