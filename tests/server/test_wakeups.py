"""The loop's wake-ups (``Signal`` for SSE readers, ``Trigger`` for the scheduling loop).

A cancel that lands in the same loop turn as the wake-up must still cancel
the waiter: with Python 3.11's ``asyncio.wait_for`` the wake-up won and the
cancel was lost, so a stopping server could wait forever for a reader or
for the scheduling loop (the agent link had the same bug: docs/agent-link.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from corral.server.services.unit import Signal, Trigger

pytestmark = pytest.mark.anyio


async def _cancel_as_it_wakes(wait: Coroutine[Any, Any, bool], wake: Callable[[], None]) -> None:
    task = asyncio.create_task(wait)
    await asyncio.sleep(0)  # the task now waits
    wake()  # its wake-up is scheduled first ...
    task.cancel()  # ... the cancel right behind it, in the same turn
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancel_racing_a_signal_is_not_lost() -> None:
    signal = Signal()
    await _cancel_as_it_wakes(signal.wait(signal.ticket(), 10.0), signal.fire)


async def test_a_cancel_racing_a_trigger_is_not_lost() -> None:
    trigger = Trigger()
    await _cancel_as_it_wakes(trigger.wait(10.0), trigger.fire)


async def test_waits_end_on_the_wake_up_or_the_timeout() -> None:
    signal, trigger = Signal(), Trigger()
    ticket = signal.ticket()
    assert await signal.wait(ticket, 0.01) is False
    signal.fire()
    assert await signal.wait(ticket, 10.0) is True, "a fire before the wait is not lost"
    assert await trigger.wait(0.01) is False
    trigger.fire()
    assert await trigger.wait(10.0) is True
    assert trigger.fired, "waiting does not clear it"
