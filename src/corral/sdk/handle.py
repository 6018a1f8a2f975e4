"""What every handle on a submitted thing shares: a job's (``Job``) or a group's (``Group``).

A handle keeps the client it came from and ``status``, what the server said about it
last; ``id`` is its status's, ``refresh()`` asks the server again. The synchronous
and asyncio handles differ only in how ``refresh`` waits for the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from corral.sdk.calls import Call

if TYPE_CHECKING:
    from corral.sdk.aio import AsyncClient
    from corral.sdk.client import Client


class _Status(Protocol):
    @property
    def id(self) -> str: ...


S = TypeVar("S", bound=_Status)


class _Handle(Generic[S]):
    status: S

    @property
    def id(self) -> str:
        return self.status.id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r}, state={self._state()!r})"

    def _state(self) -> str:
        """The state its ``repr`` shows."""
        raise NotImplementedError

    def _get(self) -> Call[S]:
        """The request that reads its status again."""
        raise NotImplementedError


class Handle(_Handle[S]):
    """A handle for synchronous code."""

    def __init__(self, client: Client, status: S) -> None:
        self.client = client
        self.status = status

    def refresh(self) -> S:
        """Ask the server for its status again (``status`` then holds it)."""
        self.status = self.client.run(self._get())
        return self.status


class AsyncHandle(_Handle[S]):
    """A handle for asyncio code: the same, ``refresh`` awaited."""

    def __init__(self, client: AsyncClient, status: S) -> None:
        self.client = client
        self.status = status

    async def refresh(self) -> S:
        """Ask the server for its status again (``status`` then holds it)."""
        self.status = await self.client.run(self._get())
        return self.status
