"""The job the end-to-end benchmark runs on corral agents: nothing, as fast as possible.

An ``async def`` handler runs on the agent's event loop; a plain ``def`` would run
in a worker thread (a blocking handler must not stall the agent), and the hop
there and back, not the work, would be most of what the agent spends on a no-op.
"""

from __future__ import annotations

from typing import Any


async def noop(ctx: Any) -> bytes:
    return b"ok"
