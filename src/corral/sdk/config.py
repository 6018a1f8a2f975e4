"""Where the server is and which token to use: flags, then environment, then the config file.

``~/.corral/config.toml`` (or the file named by ``CORRAL_CONFIG``) holds::

    url = "http://127.0.0.1:8470"
    token = "corral_..."
    ca_fingerprint = "sha256:..."   # optional: pin a self-signed https server
    ca_cert = "/path/to/ca.pem"     # optional: or trust this CA for it

``corral login URL --token T`` writes it (``save``). Each setting is taken
from the first of: the argument (a CLI flag), ``CORRAL_URL`` /
``CORRAL_TOKEN`` / ``CORRAL_CA_FINGERPRINT`` / ``CORRAL_CA_CERT``, the file,
the default (the last two only for ``https://`` URLs, see ``trust.py``);
``Target.url_from`` remembers which, so an error can say where the URL came
from. With no token anywhere and a server on this machine, the admin token
that ``corral up`` keeps in its data directory (``$CORRAL_HOME``, else next
to the config file: ``~/.corral/admin-token``) is used, so ``corral up``
then ``corral jobs`` just works.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from corral.core.errors import InvalidSpec
from corral.core.pins import parse_fingerprint
from corral.sdk.errors import ClientError

DEFAULT_URL = "http://127.0.0.1:8470"
DEFAULT_PATH = Path("~/.corral/config.toml")
ADMIN_TOKEN_FILE = "admin-token"  # written by `corral up` in its data dir (default ~/.corral)
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class ConfigError(ClientError):
    """The config file exists but cannot be read."""


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    token: str | None
    url_from: str  # "--url", "CORRAL_URL", the config file's path, or "default"
    ca_fingerprint: str | None = None  # pin of an https server's certificate (sdk/trust.py)
    ca_cert: str | None = None  # PEM file of the CA that signed the server's certificate


def config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("CORRAL_CONFIG") or DEFAULT_PATH).expanduser()


def resolve(
    url: str | None = None,
    token: str | None = None,
    *,
    ca_fingerprint: str | None = None,
    ca_cert: str | None = None,
    env: Mapping[str, str] | None = None,
    path: Path | None = None,
) -> Target:
    """The URL, token and trust to use, each from the first place that sets it."""
    env = os.environ if env is None else env
    path = path or config_path(env)
    file = load(path)
    url_choices = (
        (url, "--url"),
        (env.get("CORRAL_URL"), "CORRAL_URL"),
        (file.get("url"), str(path)),
        (DEFAULT_URL, "default"),
    )
    chosen, source = next((v, s) for v, s in url_choices if v)
    url = normalize_url(chosen)
    token = token or env.get("CORRAL_TOKEN") or file.get("token")
    token = token or _local_admin(url, path, env.get("CORRAL_HOME"))
    pin = ca_fingerprint or env.get("CORRAL_CA_FINGERPRINT") or file.get("ca_fingerprint")
    ca_file = ca_cert or env.get("CORRAL_CA_CERT") or file.get("ca_cert")
    if not url.startswith("https://"):
        return Target(url, token, source)  # trust settings are for TLS servers only
    try:
        pin = parse_fingerprint(pin) if pin else None
    except InvalidSpec as exc:
        raise ConfigError(f"CORRAL_CA_FINGERPRINT: {exc.message}") from None
    return Target(url, token, source, pin, str(Path(ca_file).expanduser()) if ca_file else None)


def _local_admin(url: str, path: Path, home: str | None) -> str | None:
    """The admin token ``corral up`` keeps in its data directory (``home``, what
    ``$CORRAL_HOME`` names, else the config file's folder), for a server on this machine
    only: a local secret is never sent to another host."""
    if urlsplit(url).hostname not in LOOPBACK:
        return None
    folder = Path(home).expanduser() if home else path.parent
    try:
        return (folder / ADMIN_TOKEN_FILE).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def normalize_url(url: str) -> str:
    """``host:port`` gets ``http://``; a trailing slash goes."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def load(path: Path) -> dict[str, str]:
    """The file's string settings; an absent file is empty, a broken one an error naming it."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the corral config file {path}: {exc}") from None
    return {k: v for k, v in data.items() if isinstance(v, str)}


def save(url: str, token: str | None, path: Path | None = None, **trust: str | None) -> Path:
    """Write ``url``, ``token`` and the trust settings given (``ca_fingerprint``,
    ``ca_cert``); other keys in the file are kept. Readable by you only."""
    path = path or config_path()
    data: dict[str, str] = load(path)
    data["url"] = normalize_url(url)
    if token:
        data["token"] = token
    data |= {k: v for k, v in trust.items() if v}
    path.parent.mkdir(parents=True, exist_ok=True)
    # JSON string escapes are valid TOML basic strings (ensure_ascii keeps them so).
    text = "".join(f"{_key(k)} = {json.dumps(v)}\n" for k, v in sorted(data.items()))
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)
