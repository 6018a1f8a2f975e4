"""The job the end-to-end benchmark runs on corral agents: nothing, as fast as possible."""

from __future__ import annotations

from typing import Any


def noop(ctx: Any) -> bytes:
    return b"ok"
