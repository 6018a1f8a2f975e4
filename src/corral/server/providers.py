"""The real providers: a command you write, a webhook you serve, or a fixed set of machines
(DESIGN.md section 4).

The command and the webhook speak the same JSON, one request per call of the
``Provider`` protocol (``corral.autoscaler.provider``):

* ``list``: no input; answers ``{"members": [{"name", "pool", "launched_at"?}]}``.
  ``launched_at`` (unix seconds) may be left out: the provider then uses the
  time it first saw the name.
* ``launch``: ``{"pool": {...}, "names": [...], "server": ..., "token": ...,
  "request_id": ...}``; start one machine per name whose agent joins as that
  name. The answer is ignored. The same ``request_id`` may come again (corral
  could not tell whether the first call arrived): start nothing more for it.
* ``terminate``: ``{"names": [...]}``; names you do not run are no error.

``CommandProvider`` runs ``<command> list|launch|terminate`` with the request on
stdin and the answer on stdout; a non-zero exit is a failure. ``WebhookProvider``
POSTs ``{"action": "list"|"launch"|"terminate", ...}`` to one URL; a non-2xx status
is a failure. Every failure is a ``ProviderError`` that names the call and why.
Both pass the conformance suite in ``corral.autoscaler.testing``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shlex
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from corral.autoscaler.api import Member, Pool
from corral.autoscaler.provider import Join, ProviderError
from corral.core.errors import InvalidSpec

STDERR_TAIL = 500  # characters of a failed command's stderr kept in the error: its last words
BODY_EXCERPT = 300  # characters of a failed webhook reply's body kept in the error


def pool_to_json(pool: Pool) -> dict[str, Any]:
    """The pool as a launch request carries it: plain JSON types, sorted for stable output."""
    return {
        "name": pool.name,
        "gpus": pool.gpus,
        "gpu_model": pool.gpu_model,
        "vram_bytes": pool.vram_bytes,
        "cpus": pool.cpus,
        "labels": dict(sorted(pool.labels.items())),
        "backends": sorted(pool.backends),
        "min_nodes": pool.min_nodes,
        "max_nodes": pool.max_nodes,
        "cost_per_hour": pool.cost_per_hour,
        "max_spend_per_hour": pool.max_spend_per_hour,
        "provider": pool.provider,
    }


def launch_request(pool: Pool, names: Sequence[str], join: Join, request_id: str) -> dict[str, Any]:
    return {
        "pool": pool_to_json(pool),
        "names": list(names),
        "server": join.server,
        "token": join.token,
        "request_id": request_id,
    }


class FirstSeen:
    """When each member name was first listed: the ``launched_at`` of members that omit it.

    Names that leave the list are forgotten, so the dict stays as small as the fleet.
    """

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.now = now
        self.times: dict[str, float] = {}

    def stamp(self, names: Sequence[str]) -> dict[str, float]:
        now = self.now()
        self.times = {name: self.times.get(name, now) for name in names}
        return self.times


def members_from_json(obj: object, seen: FirstSeen | None = None) -> list[Member]:
    """Check a ``list`` answer and turn it into members; ``ValueError`` names the bad field.

    A member without ``launched_at`` gets the time ``seen`` first saw its name.
    """
    if not isinstance(obj, dict):
        raise ValueError(f'expected an object {{"members": [...]}}, got {type(obj).__name__}')
    items = obj.get("members")
    if not isinstance(items, list):
        raise ValueError("members missing or not a list")
    rows = [_member_row(i, item) for i, item in enumerate(items)]
    names = [name for name, _, _ in rows]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"members: names listed twice: {', '.join(twice)}")
    first = (seen or FirstSeen()).stamp(names)
    return [Member(name, pool, first[name] if at is None else at) for name, pool, at in rows]


def _member_row(i: int, item: object) -> tuple[str, str, float | None]:
    where = f"members[{i}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where} is not an object")
    for key in ("name", "pool"):
        if key not in item:
            raise ValueError(f"{where}.{key} missing")
        if not isinstance(item[key], str) or not item[key]:
            raise ValueError(f"{where}.{key} must be a non-empty string, got {item[key]!r}")
    at = item.get("launched_at")
    if at is not None and (
        isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at) or at < 0
    ):
        raise ValueError(f"{where}.launched_at must be unix seconds (a number >= 0), got {at!r}")
    return item["name"], item["pool"], None if at is None else float(at)


class CommandProvider:
    """Runs ``command list|launch|terminate``: the request as JSON on stdin, the answer on stdout.

    The command runs in its own process group, which is killed whole when it
    outlasts ``timeout_s`` (or the caller gives up). Whatever it leaves running
    (the machines it starts) must not keep its stdout or stderr open, or the
    call waits for them until the timeout.
    """

    def __init__(
        self,
        command: str | Sequence[str],
        timeout_s: float = 60.0,
        *,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.argv:
            raise InvalidSpec("autoscale.command", "must name an executable")
        if timeout_s <= 0:
            raise InvalidSpec("autoscale.timeout_s", f"must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.seen = FirstSeen(now)

    async def members(self) -> list[Member]:
        out = await self._run("list", {})
        try:
            return members_from_json(_parse_json(out), self.seen)
        except ValueError as exc:
            raise ProviderError(f"command provider list: {exc}") from None

    async def launch(
        self, pool: Pool, names: Sequence[str], join: Join, *, request_id: str
    ) -> None:
        if names:
            await self._run("launch", launch_request(pool, names, join, request_id))

    async def terminate(self, names: Sequence[str]) -> None:
        if names:
            await self._run("terminate", {"names": list(names)})

    async def _run(self, action: str, request: dict[str, Any]) -> bytes:
        """Run the command for ``action`` and return its stdout, or raise ``ProviderError``."""
        proc = await self._start(action)
        try:
            async with asyncio.timeout(self.timeout_s):
                out, err = await proc.communicate(json.dumps(request).encode())
        except TimeoutError:
            await _kill_group(proc)
            raise ProviderError(
                f"command provider {action}: {self.argv[0]} gave no answer within the "
                f"{self.timeout_s:g}s timeout; killed it"
            ) from None
        except BaseException:
            await _kill_group(proc)
            raise
        if proc.returncode != 0:
            raise ProviderError(
                f"command provider {action}: {self.argv[0]} {_exit_text(proc.returncode)}: "
                f"{_tail(err)}"
            )
        return out

    async def _start(self, action: str) -> asyncio.subprocess.Process:
        try:
            return await asyncio.create_subprocess_exec(
                *self.argv,
                action,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own group: a timeout kills what it started too
            )
        except FileNotFoundError:
            why = "no such file (give a path, or put it on PATH)"
        except PermissionError:
            why = "permission denied (is it executable? chmod +x)"
        except OSError as exc:
            why = exc.strerror or str(exc)
        raise ProviderError(f"command provider {action}: cannot run {self.argv[0]!r}: {why}")


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """Kill the command and everything in its process group, and reap it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _tail(stderr: bytes) -> str:
    text = stderr.decode(errors="replace").strip()
    if not text:
        return "(no stderr)"
    return text if len(text) <= STDERR_TAIL else "..." + text[-STDERR_TAIL:]


def _parse_json(out: bytes) -> object:
    """The command's stdout as JSON; ``ValueError`` says what it printed instead."""
    text = out.decode(errors="replace").strip()
    if not text:
        raise ValueError('printed nothing; expected {"members": [...]} on stdout')
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"stdout is not JSON ({exc}): {text[:200]!r}") from None


class WebhookProvider:
    """POSTs ``{"action": ..., ...}`` to ``url``, with ``Authorization: Bearer <token>`` if given.

    ``transport`` replaces the network (``httpx.MockTransport`` in tests). Call
    ``aclose()`` when done.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        now: Callable[[], float] = time.time,
    ) -> None:
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise InvalidSpec("autoscale.webhook", f"must be an http(s) URL, got {url!r}")
        self.url = url
        self.shown_url = f"{parsed.scheme}://{parsed.netloc.decode()}{parsed.path}"  # no query
        self.timeout_s = timeout_s
        self.seen = FirstSeen(now)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=timeout_s, transport=transport)

    async def members(self) -> list[Member]:
        reply = await self._post("list", {})
        try:
            return members_from_json(reply.json(), self.seen)
        except ValueError as exc:  # json.JSONDecodeError is one
            raise ProviderError(f"webhook list: {exc}") from None

    async def launch(
        self, pool: Pool, names: Sequence[str], join: Join, *, request_id: str
    ) -> None:
        if names:
            await self._post("launch", launch_request(pool, names, join, request_id))

    async def terminate(self, names: Sequence[str]) -> None:
        if names:
            await self._post("terminate", {"names": list(names)})

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _post(self, action: str, body: dict[str, Any]) -> httpx.Response:
        """POST ``action`` and return a 2xx reply, or raise ``ProviderError``."""
        where = f"webhook {action}: {self.shown_url}"
        try:
            reply = await self.client.post(self.url, json={"action": action, **body})
        except httpx.TimeoutException:
            raise ProviderError(f"{where} gave no answer within {self.timeout_s:g}s") from None
        except httpx.HTTPError as exc:
            raise ProviderError(f"{where} cannot be reached: {type(exc).__name__}: {exc}") from None
        if not reply.is_success:
            excerpt = reply.text.strip()[:BODY_EXCERPT] or "(empty body)"
            raise ProviderError(
                f"{where} answered HTTP {reply.status_code} {reply.reason_phrase}: {excerpt}"
            )
        return reply


class FixedProvider:
    """Machines you run yourself, always there: one pool's capacity and price, never started
    or stopped.

    Listing them makes their pool's idle machines count as room for waiting work (so a
    cloud pool is not started while they are free) and puts their cost in the spend
    figures. Their pool keeps ``min_nodes = max_nodes`` = how many there are
    (``server/autoscaling.py``), so the policy never launches or removes one; a launch
    asked anyway is a failure, a terminate does nothing.
    """

    def __init__(self, pool: str, names: Sequence[str], *, now: Callable[[], float] = time.time):
        self.pool = pool
        self.names = list(names)
        self.since = now()

    async def members(self) -> list[Member]:
        return [Member(name, self.pool, self.since) for name in self.names]

    async def launch(
        self, pool: Pool, names: Sequence[str], join: Join, *, request_id: str
    ) -> None:
        if names:
            raise ProviderError(f"fixed provider launch: {pool.name} is a fixed set of machines")

    async def terminate(self, names: Sequence[str]) -> None:
        return None
