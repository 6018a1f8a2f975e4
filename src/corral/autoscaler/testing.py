"""The provider conformance suite: one set of checks every provider passes (STYLE.md habit 7).

``SimulatedProvider``, the command provider and the webhook provider (and any
provider you write) run ``check_provider`` in their tests, so they keep the
same contract (``corral.autoscaler.provider``): launched names are listed with
their pool and a launch time, a launch sent again with the same request id
starts nothing more, a terminate removes exactly the names it is given, and
terminating a name twice, or one never launched, is no error. The
checks are plain async functions that raise ``AssertionError``; they need no
test framework and no clock (``launched_at`` is only checked to be a time).

Each check launches fresh names (``<prefix>-<n>``) and terminates them again,
so a provider with machines of its own keeps them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence

from corral.autoscaler.api import Member, Pool
from corral.autoscaler.provider import Join, Provider

GiB = 1024**3
POOL_A = Pool(
    "conformance-a",
    gpus=2,
    gpu_model="RTX 4090",
    vram_bytes=24 * GiB,
    cpus=8,
    labels={"zone": "test"},
    backends=frozenset({"python"}),
    max_nodes=4,
    cost_per_hour=1.5,
)
POOL_B = Pool("conformance-b", cpus=4, max_nodes=2)
JOIN = Join("grpc://127.0.0.1:8471", "corral_agent_conformance-token")


class Names:
    """Fresh member names and request ids for the checks: ``<prefix>-1``, ``<prefix>-2``, ..."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._numbers: Iterator[int] = itertools.count(1)

    def take(self, n: int) -> list[str]:
        return [f"{self.prefix}-{next(self._numbers)}" for _ in range(n)]

    def request(self) -> str:
        return f"req-{self.prefix}-{next(self._numbers)}"


Check = Callable[[Provider, Names], Awaitable[None]]


async def check_provider(provider: Provider, *, fresh: bool = True, prefix: str = "x") -> None:
    """Run every check in ``CHECKS`` against ``provider``.

    ``fresh``: the provider runs no machine yet, so it must list none at the
    start and none again at the end. Otherwise the machines it runs at the
    start must be the ones it runs at the end.
    """
    assert isinstance(provider, Provider), f"{type(provider).__name__} lacks a Provider method"
    before = await listed(provider)
    if fresh:
        assert before == {}, f"a fresh provider lists no members, got {sorted(before)}"
    names = Names(prefix)
    for check in CHECKS:
        await check(provider, names)
    after = await listed(provider)
    assert after.keys() == before.keys(), (
        f"after the checks the members should be as before: {sorted(before)}, got {sorted(after)}"
    )


async def check_launch_lists_members(provider: Provider, names: Names) -> None:
    """Launched names are listed, new, with their pool and a launch time."""
    new = names.take(2)
    before = await listed(provider)
    assert not before.keys() & set(new), f"{new} are new names, yet listed before launch"
    await provider.launch(POOL_A, new, JOIN, request_id=names.request())
    now = await listed(provider)
    for name in new:
        assert name in now, f"launched {name} is not listed: {sorted(now)}"
        assert now[name].pool == POOL_A.name, f"{name}: pool {now[name].pool!r}, want {POOL_A.name}"
        at = now[name].launched_at
        assert isinstance(at, float), f"{name}: launched_at {at!r} is not a float"
        assert math.isfinite(at), f"{name}: launched_at {at!r} is not a time"
        assert at > 0, f"{name}: launched_at {at!r} is not a time after 1970"
    await terminate_all(provider, new)


async def check_pools_listed_apart(provider: Provider, names: Names) -> None:
    """A launch in a second pool adds to the first; each member keeps its own pool."""
    in_a, in_b = names.take(2), names.take(1)
    await provider.launch(POOL_A, in_a, JOIN, request_id=names.request())
    await provider.launch(POOL_B, in_b, JOIN, request_id=names.request())
    now = await listed(provider)
    want = {**dict.fromkeys(in_a, POOL_A.name), **dict.fromkeys(in_b, POOL_B.name)}
    got = {name: now[name].pool for name in want if name in now}
    assert got == want, f"members by pool: want {want}, got {got}"
    await terminate_all(provider, in_a + in_b)


async def check_terminate_removes_only_those(provider: Provider, names: Names) -> None:
    """Terminating one name leaves the others listed, with their launch times unchanged."""
    gone, *kept = names.take(3)
    await provider.launch(POOL_A, [gone, *kept], JOIN, request_id=names.request())
    first = await listed(provider)
    await provider.terminate([gone])
    now = await listed(provider)
    assert gone not in now, f"terminated {gone} is still listed"
    for name in kept:
        assert name in now, f"{name} was not terminated, yet is no longer listed"
        assert now[name].launched_at == first[name].launched_at, (
            f"{name}: launched_at moved from {first[name].launched_at} to {now[name].launched_at}"
        )
    await terminate_all(provider, kept)


async def check_terminate_is_idempotent(provider: Provider, names: Names) -> None:
    """Terminating twice, a name never launched, or no names at all raises nothing."""
    (name,) = names.take(1)
    never = names.take(1)
    await provider.launch(POOL_B, [name], JOIN, request_id=names.request())
    await provider.terminate([name])
    await provider.terminate([name])
    await provider.terminate(never)
    await provider.terminate([])
    now = await listed(provider)
    assert name not in now, f"{name} terminated twice is still listed"
    assert never[0] not in now, f"{never[0]} was never launched, yet is listed"


async def check_launch_again_starts_nothing_more(provider: Provider, names: Names) -> None:
    """A launch sent again with the same request id (the first answer was lost) leaves the
    machines as the first one started them: listed once each, launch times unchanged."""
    new = names.take(2)
    request = names.request()
    await provider.launch(POOL_A, new, JOIN, request_id=request)
    first = await listed(provider)
    await provider.launch(POOL_A, new, JOIN, request_id=request)
    now = await listed(provider)
    assert now.keys() == first.keys(), f"a repeated launch changed {sorted(first)} to {sorted(now)}"
    for name in new:
        assert now[name].launched_at == first[name].launched_at, (
            f"{name} was started again: launched_at {first[name].launched_at} -> "
            f"{now[name].launched_at}"
        )
    await terminate_all(provider, new)


async def check_launch_nothing(provider: Provider, names: Names) -> None:
    """A launch of no names starts nothing."""
    before = await listed(provider)
    await provider.launch(POOL_A, [], JOIN, request_id=names.request())
    after = await listed(provider)
    assert after.keys() == before.keys(), (
        f"launching no names changed {sorted(before)} to {sorted(after)}"
    )


CHECKS: tuple[Check, ...] = (
    check_launch_lists_members,
    check_pools_listed_apart,
    check_terminate_removes_only_those,
    check_terminate_is_idempotent,
    check_launch_again_starts_nothing_more,
    check_launch_nothing,
)


async def listed(provider: Provider) -> dict[str, Member]:
    """The provider's members by name; each must be a ``Member`` and listed once."""
    members = await provider.members()
    assert isinstance(members, list), f"members() returns a list, got {type(members).__name__}"
    for m in members:
        assert isinstance(m, Member), f"members() returns Member values, got {m!r}"
    by_name = {m.name: m for m in members}
    assert len(by_name) == len(members), f"a name is listed twice: {[m.name for m in members]}"
    return by_name


async def terminate_all(provider: Provider, names: Sequence[str]) -> None:
    """Terminate ``names`` and check none of them is listed any more."""
    await provider.terminate(names)
    left = sorted(set(names) & (await listed(provider)).keys())
    assert not left, f"terminated, yet still listed: {left}"
