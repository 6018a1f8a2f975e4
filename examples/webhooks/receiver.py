"""A webhook receiver for corral: checks each call's signature, refuses replays, prints
each event once. Standard library only.

    export CORRAL_WEBHOOK_SECRET=$(corral webhooks secret)
    python examples/webhooks/receiver.py --port 8600
    corral submit --webhook http://my-host:8600/corral ...   # or "webhook": {"url": ...}

What it checks, in order (docs/server.md, "Webhooks"):

1. ``Corral-Signature: t=<unix seconds>,v1=<hex>``: ``v1`` must be the HMAC-SHA256,
   keyed with the team's secret, of ``"<t>." + body`` (the raw bytes, before any JSON
   parsing), compared in constant time;
2. ``t`` within the replay window (five minutes) of this machine's clock: a call
   recorded and sent again later is refused;
3. ``Corral-Delivery`` not seen before: corral delivers at least once (a retry after
   an answer that was lost), so the same delivery is acted on once.

It answers 2xx as soon as the call is checked; slow work belongs in a queue of your
own (corral waits ``webhooks.timeout_s`` for the answer, then retries).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REPLAY_WINDOW_S = 300
MAX_BODY = 1024 * 1024


def verify(
    secret: str, header: str, body: bytes, now: float, window_s: float = REPLAY_WINDOW_S
) -> bool:
    """Is ``header`` (Corral-Signature) a signature of ``body`` by ``secret`` made
    within ``window_s`` of ``now``?"""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > window_s:
        return False
    signed = f"{timestamp}.".encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields.get("v1", ""))


class Receiver(ThreadingHTTPServer):
    """An HTTP server that hands each checked, first-seen event to ``on_event``."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        secret: str,
        on_event: Callable[[dict[str, Any]], None],
        status: int = 200,
    ) -> None:
        super().__init__(address, Handler)
        self.secret = secret
        self.on_event = on_event
        self.status = status  # what it answers a good call (tests: 500, a broken receiver)
        self.seen: set[str] = set()
        self.refused = 0
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self._answer(413, "too large")
        body = self.rfile.read(length)
        header = self.headers.get("Corral-Signature", "")
        if not verify(self.server.secret, header, body, time.time()):
            with self.server.lock:
                self.server.refused += 1
            return self._answer(401, "bad or old signature")
        delivery = self.headers.get("Corral-Delivery", "")
        with self.server.lock:
            first = delivery not in self.server.seen
            self.server.seen.add(delivery)
        if first and self.server.status < 300:
            self.server.on_event(json.loads(body))
        self._answer(self.server.status, "ok" if self.server.status < 300 else "broken")

    def _answer(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: events are printed by on_event


def show(event: dict[str, Any]) -> None:
    job = event.get("job", {})
    print(f"{event['type']}: job {job.get('id')} is {job.get('state')}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8600)
    args = parser.parse_args()
    secret = os.environ.get("CORRAL_WEBHOOK_SECRET")
    if not secret:
        raise SystemExit("set CORRAL_WEBHOOK_SECRET (corral webhooks secret prints it)")
    server = Receiver((args.host, args.port), secret, show)
    print(f"listening on http://{args.host}:{args.port}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
