"""Which webhook URLs the server calls: the server faces the internet, so a URL a client
names must not turn it into a proxy into its own network (SSRF).

``check_form`` runs when a job is submitted: http or https, a host, no credentials in
the URL (they would be stored and shown with the job), no fragment. ``refusal`` runs
before each call, on the addresses the host resolves to then: loopback, private,
link-local (cloud metadata at 169.254.169.254), multicast and reserved addresses are
refused unless ``webhooks.allow_private`` (tests, a receiver on the same machine or
LAN). The call then connects to the address checked, not to a second lookup's answer,
so a DNS answer that changes between check and call (rebinding) cannot reach inside.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from corral.core.errors import InvalidSpec

FIELD = "webhook.url"
SCHEMES = ("http", "https")

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def check_form(url: str) -> None:
    """Refuse (ValueError, which the schema reports naming the field) a URL that is not a
    plain http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        port = parts.port  # reads the port: a bad one raises here
    except ValueError as e:
        raise ValueError(f"not a URL: {e}") from None
    if parts.scheme not in SCHEMES:
        raise ValueError("must be an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError("must name a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not hold credentials (put a token in the path or query)")
    if parts.fragment:
        raise ValueError("must not have a #fragment")
    if port == 0:
        raise ValueError("port 0 is not a port a receiver listens on")
    if any(ord(c) < 33 for c in url):
        raise ValueError("must not contain spaces or control characters")


def check_literal(url: str, allow_private: bool) -> None:
    """At submission: a host given as an address (or ``localhost``) must be one the server
    may call; a name is checked when called (its addresses may change meanwhile)."""
    if allow_private:
        return
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        raise InvalidSpec(FIELD, "must not point at this machine (webhooks.allow_private)")
    address = _address(host)
    if address is not None and not public(address):
        raise InvalidSpec(
            FIELD, f"{address} is not a public address (set webhooks.allow_private to allow it)"
        )


def refusal(addresses: list[str], allow_private: bool) -> str | None:
    """Why the server will not call a host resolving to ``addresses`` (None: it may)."""
    if not addresses:
        return "the host resolves to no address"
    if allow_private:
        return None
    for text in addresses:
        address = _address(text)
        if address is None or not public(address):
            return f"the host resolves to {text}, not a public address (webhooks.allow_private)"
    return None


def public(address: IpAddress) -> bool:
    """An address on the public internet (an IPv4-mapped IPv6 address as its IPv4 one)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def _address(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
