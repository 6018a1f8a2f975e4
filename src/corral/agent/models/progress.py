"""Fanning download progress out to whoever watches (the agent link, logs, tests).

Two ways to listen: ``add_listener(callback)`` for synchronous code, and
``watch()``, an async iterator. A watcher that falls behind never makes the
downloader wait or memory grow: it holds at most one pending value per model,
the latest (progress is a level, not a log).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from corral.agent.models.spec import DownloadProgress

Listener = Callable[[DownloadProgress], None]


class _Watcher:
    def __init__(self) -> None:
        self.pending: dict[str, DownloadProgress] = {}
        self.wakeup = asyncio.Event()
        self.closed = False

    def push(self, progress: DownloadProgress) -> None:
        self.pending.pop(progress.model, None)  # re-insert: order is by latest change
        self.pending[progress.model] = progress
        self.wakeup.set()


class ProgressHub:
    """Publishes ``DownloadProgress`` to listeners and watchers."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._watchers: set[_Watcher] = set()

    def publish(self, progress: DownloadProgress) -> None:
        for listener in list(self._listeners):
            listener(progress)
        for watcher in self._watchers:
            watcher.push(progress)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with every update; returns a function that stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def watch(self) -> AsyncIterator[DownloadProgress]:
        """Every update from now on (coalesced per model when the reader lags) until close."""
        watcher = _Watcher()
        self._watchers.add(watcher)
        try:
            while True:
                while not watcher.pending:
                    if watcher.closed:
                        return
                    watcher.wakeup.clear()
                    await watcher.wakeup.wait()
                model = next(iter(watcher.pending))
                yield watcher.pending.pop(model)
        finally:
            self._watchers.discard(watcher)

    def close(self) -> None:
        """End every ``watch()`` once it has delivered what is pending."""
        for watcher in self._watchers:
            watcher.closed = True
            watcher.wakeup.set()
