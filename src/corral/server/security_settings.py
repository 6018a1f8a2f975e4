"""Settings of what bounds and guards the server on the internet: per-token limits, team
quotas, TLS, and the admin token's strength (docs/security/; ``CORRAL_LIMITS__*``,
``CORRAL_QUOTAS__*``, ``CORRAL_TLS__*``). Part of the one settings tree (``settings.py``).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, Field

MIN_ADMIN_TOKEN_CHARS = 32
"""A configured admin token shorter than this is refused at start. Generated tokens carry
256 random bits in 43 characters; 32 random characters of any usual alphabet carry 128."""

MIN_ADMIN_TOKEN_BITS = 80.0
"""... and so is one whose characters, counted as they occur, carry fewer bits than this (a
run of one letter, a few letters over and over). The count undercounts random tokens: 32
random hex digits (128 bits) count 90 to 125, so a random token is never refused."""


def weakness(secret: str) -> str | None:
    """Why ``secret`` is too weak to be an admin token, or None. Never quotes the secret."""
    size = len(secret)
    if size < MIN_ADMIN_TOKEN_CHARS:
        return f"its length is {size}, at least {MIN_ADMIN_TOKEN_CHARS} characters are needed"
    if _period(secret) <= size // 2:
        return "it is a short pattern repeated"
    bits = -sum(n * math.log2(n / size) for n in Counter(secret).values())
    if bits < MIN_ADMIN_TOKEN_BITS:
        need = MIN_ADMIN_TOKEN_BITS
        return f"it uses too few different characters ({bits:.0f} bits, {need:.0f} needed)"
    return None


def _period(text: str) -> int:
    """The shortest ``p`` with ``text[i] == text[i + p]`` throughout (its longest border, KMP)."""
    border = [0] * len(text)
    k = 0
    for i in range(1, len(text)):
        while k and text[i] != text[k]:
            k = border[k - 1]
        if text[i] == text[k]:
            k += 1
        border[i] = k
    return len(text) - (border[-1] if text else 0)


class LimitsSettings(BaseModel):
    """What one token may use at once: open streams, requests and submissions per second
    (docs/security/limits.md). The admin token is held to the server-wide stream cap only:
    it is the operator's own, and whoever holds it can change every limit anyway."""

    streams_per_token: int = Field(
        default=50,
        ge=1,
        description="event streams (SSE, ComfyUI websockets) one token may hold open: a "
        "dashboard holds one, an app following its running jobs one per job",
    )
    streams_total: int = Field(
        default=1000,
        ge=1,
        description="event streams open on this server in all, every token together: each "
        "holds a connection and a little memory",
    )
    stream_table_readers: int = Field(
        default=4,
        ge=1,
        description="streams that read the database at once (history, a job's state); the "
        "others wait their turn. Never more than half of store.pool_size, so requests, "
        "/healthz and agents always find a connection",
    )
    requests_per_s: float = Field(
        default=100.0,
        ge=0,
        description="requests a team token may make per second, sustained (0: no limit); "
        "a busy app polling progress for its users stays well below",
    )
    requests_burst: int = Field(
        default=500, ge=1, description="requests a team token may make at once, after a pause"
    )
    submit_jobs_per_s: float = Field(
        default=100.0,
        ge=0,
        description="jobs a team token may submit per second, sustained, a batch counting "
        "each of its jobs (0: no limit)",
    )
    submit_burst: int = Field(
        default=2000,
        ge=1,
        description="jobs a team token may submit at once, after a pause: two full batches "
        "(api.max_batch_jobs)",
    )


class TeamQuota(BaseModel):
    """One team's own caps, instead of the defaults (``quotas.teams``)."""

    max_queued_jobs: int | None = Field(default=None, ge=0, description="0: no cap")
    max_stored_bytes: int | None = Field(default=None, ge=0, description="0: no cap")


class QuotaSettings(BaseModel):
    """What a team may hold (docs/security/limits.md). Submissions with a team token are
    checked; the admin's are not (the operator decides what the admin submits)."""

    max_queued_jobs: int = Field(
        default=100_000,
        ge=0,
        description="jobs a team may have waiting in the queue; more are refused with 429 "
        "until some start (0: no cap). Far above what a busy team keeps waiting",
    )
    max_stored_bytes: int = Field(
        default=100 * 1024**3,
        ge=0,
        description="bytes of results a team's jobs may keep stored (100 GiB: about 100,000 "
        "images); past it submissions are refused with 403 until finished jobs are deleted "
        "or retention removes them (0: no cap)",
    )
    usage_refresh_s: float = Field(
        default=10.0,
        gt=0,
        description="a team's queued jobs and stored bytes are counted in the database at "
        "most this often; between counts this server adds what it accepted",
    )
    teams: dict[str, TeamQuota] = Field(
        default_factory=dict,
        description="caps for some teams, e.g. {'research': {'max_queued_jobs': 500000}}",
    )


class TlsSettings(BaseModel):
    """TLS for the HTTP API and the agent link, on both ports alike (docs/security/tls.md)."""

    mode: str = Field(
        default="auto",
        pattern="^(auto|self-signed|off)$",
        description="auto: TLS when tls.cert is given, else a self-signed certificate when the "
        "server listens beyond this machine (a token must never cross a network in clear), "
        "else plain http for 127.0.0.1 (corral up, a reverse proxy on this host); "
        "self-signed: always; off: never (a reverse proxy elsewhere terminates TLS)",
    )
    cert: Path | None = Field(
        default=None, description="PEM certificate (chain) to serve instead of a self-signed one"
    )
    key: Path | None = Field(default=None, description="PEM private key of tls.cert")
    names: list[str] = Field(
        default_factory=list,
        description="extra host names and addresses the self-signed certificate lists, so "
        "clients that check names (curl --cacert) accept it; pinned clients need none",
    )
