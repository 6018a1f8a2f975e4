"""Worker threads for plain (sync) handler calls, answering the event loop in batches.

``asyncio.to_thread`` costs a job a thread-pool submission, two chained futures
and one loop wake-up per call. These workers take calls from one queue and
hand answers back through one list per loop: the worker that finds the list
empty wakes the loop, later answers join it, and the loop settles them all in
one callback. A busy agent thus pays one wake-up for many calls; an idle one
pays what it did. Threads start when every one is busy (up to ``max_threads``),
are daemons (an abandoned handler never holds the agent's exit) and end after
``IDLE_EXIT_S`` without work.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

IDLE_EXIT_S = 60.0
"""A worker thread with nothing to do for this long ends (a later call starts another)."""

MAX_THREADS = 32
"""Handler calls running at once, at most (as ``asyncio.to_thread``'s default pool, at most)."""

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]
_Answer = tuple["asyncio.Future[Any]", bool, Any]


class Workers:
    def __init__(self, max_threads: int = MAX_THREADS, idle_exit_s: float = IDLE_EXIT_S) -> None:
        self._max = max_threads
        self._idle_exit_s = idle_exit_s
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a call
        self._pending = 0  # calls queued, not yet taken
        self._answers: dict[asyncio.AbstractEventLoop, list[_Answer]] = {}

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on a worker thread; its outcome arrives in the returned future."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._pending += 1
            if self._pending > self._idle and self._threads < self._max:
                self._threads += 1
                self._idle += 1
                threading.Thread(target=self._work, name="corral-handler", daemon=True).start()
        self._calls.put((loop, future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            try:
                loop, future, fn, args = self._calls.get(timeout=self._idle_exit_s)
            except queue.Empty:
                with self._lock:
                    if self._pending < self._idle:  # a spare thread: end it
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._pending -= 1
                self._idle -= 1
            try:
                answer: _Answer = (future, True, fn(*args))
            except BaseException as exc:  # the handler's failure is its caller's business
                answer = (future, False, exc)
            self._answer(loop, answer)
            with self._lock:
                self._idle += 1

    def _answer(self, loop: asyncio.AbstractEventLoop, answer: _Answer) -> None:
        with self._lock:
            box = self._answers.setdefault(loop, [])
            box.append(answer)
            first = len(box) == 1
        if not first:
            return  # the loop is already told: it settles this one with the rest
        try:
            loop.call_soon_threadsafe(self._settle, loop)
        except RuntimeError:  # the loop is closed: nobody waits any more
            with self._lock:
                self._answers.pop(loop, None)

    def _settle(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            answers = self._answers.pop(loop, [])
        for future, ok, value in answers:
            if future.cancelled():
                continue
            if ok:
                future.set_result(value)
            elif isinstance(value, StopIteration):  # a future refuses it
                future.set_exception(RuntimeError(f"the handler raised {value!r}"))
            else:
                future.set_exception(value)
