"""Clients for the revocation and admin token tests: an SSE stream followed in a thread,
and token calls over HTTP."""

from __future__ import annotations

import threading
from typing import Any

import httpx

DEADLINE_S = 10.0  # the promise is about a second; the wait is generous, never a timing


class Follower:
    """One SSE stream read in a thread until the server ends it (the read timeout is far
    longer than any wait here, so only the server can end it in time)."""

    def __init__(self, base_url: str, token: str, path: str) -> None:
        self.lines: list[str] = []
        self.status = 0
        self.error: BaseException | None = None
        self.first = threading.Event()  # a frame arrived: the stream is open and registered
        self.ended = threading.Event()
        self._args = (base_url, token, path)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self.first.wait(DEADLINE_S), f"no frame on {path} (status {self.status})"

    def _read(self) -> None:
        base_url, token, path = self._args
        timeout = httpx.Timeout(10, read=120)
        try:
            with (
                httpx.Client(base_url=base_url, headers=bearer(token), timeout=timeout) as http,
                http.stream("GET", path) as response,
            ):
                self.status = response.status_code
                for line in response.iter_lines():
                    self.lines.append(line)
                    if line.startswith("data:"):
                        self.first.set()
        except BaseException as exc:  # recorded: a stream must end cleanly, not break
            self.error = exc
        finally:
            self.first.set()
            self.ended.set()

    def wait_ended(self) -> None:
        assert self.ended.wait(DEADLINE_S), "the revoked token's stream is still open"
        assert self.error is None, f"the stream broke instead of ending: {self.error!r}"
        assert self.status == 200


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def new_token(http: httpx.Client, kind: str, name: str, team: str | None = None) -> dict[str, Any]:
    reply = http.post("/v1/tokens", json={"kind": kind, "name": name, "team": team})
    assert reply.status_code == 201, reply.text
    token: dict[str, Any] = reply.json()
    return token


def revoke(http: httpx.Client, token: dict[str, Any]) -> None:
    assert http.delete(f"/v1/tokens/{token['id']}").status_code == 204
