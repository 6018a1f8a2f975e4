"""Which commits wait for the disk (SQLite), and when the scheduling loop runs after a trigger."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from server_harness import World

from corral.core.events import EventKind
from corral.core.states import JobState
from corral.server.agentlink.base import Ack
from corral.server.services.unit import Tx
from corral.server.store.db import (
    WAL_AUTOCHECKPOINT_PAGES,
    WAL_FRAME_HEADER_BYTES,
    WAL_HEADER_BYTES,
    Database,
    parse_db,
)
from corral.server.store.wal_sync import PREFILL_CHUNK, WalSync

pytestmark = pytest.mark.anyio

NORMAL = 1  # what PRAGMA synchronous reads back


async def _level(db: Database, *, durable: bool = True) -> int:
    async with db.write(durable=durable) as conn:
        return int((await conn.execute(sa.text("PRAGMA synchronous"))).scalar_one())


async def test_a_durable_write_returns_after_an_fsync_of_the_wal_that_followed_its_commit(
    tmp_path: Path,
) -> None:
    db = Database(parse_db(str(tmp_path / "c.db")))
    await db.prepare()
    sync = db.wal_sync
    assert sync is not None
    try:
        # Commits themselves skip SQLite's fsync (the write lock is not held through it) ...
        assert await _level(db) == NORMAL
        assert sync.synced == sync.committed, "... and the durable write waited for its fsync"
        syncs = sync.syncs
        assert await _level(db, durable=False) == NORMAL
        assert (sync.syncs, sync.synced) == (syncs, sync.committed - 1), "relaxed: no fsync"
        await _level(db)
        assert sync.syncs == syncs + 1
        assert sync.synced == sync.committed
    finally:
        await db.close()


async def test_concurrent_durable_writes_share_fsyncs(tmp_path: Path) -> None:
    db = Database(parse_db(str(tmp_path / "c.db")))
    await db.prepare()
    sync = db.wal_sync
    assert sync is not None
    try:
        before = sync.syncs
        await asyncio.gather(*(_level(db) for _ in range(20)))
        assert sync.synced == sync.committed
        assert sync.syncs - before < 20, "commits made during an fsync wait for the next one"
    finally:
        await db.close()


async def test_fast_fsyncs_run_on_the_loop_and_slow_ones_on_the_thread_with_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.server.store import wal_sync

    took = {"s": 0.0001}
    on_loop: list[bool] = []

    def timed(path: Path) -> float:  # stands in for the disk: no real fsync is timed
        on_loop.append(threading.current_thread() is threading.main_thread())
        return took["s"]

    monkeypatch.setattr(wal_sync.WalFile, "fsync", lambda held: timed(held.path))
    sync = wal_sync.WalSync(tmp_path / "x.db-wal")

    async def durable_commits(n: int) -> list[bool]:
        before = len(on_loop)
        for _ in range(n):
            await sync.wait(sync.mark())
        return on_loop[before:]

    assert await durable_commits(3) == [True] * 3, "fast fsyncs run on the loop"
    took["s"] = 0.02  # the disk slows down: the fsync that shows it is the last on the loop
    assert await durable_commits(2) == [True, False]
    every = wal_sync.FIRST_PROBE_EVERY
    # Every `every`-th fsync probes on the loop; slow again, the interval doubles.
    assert await durable_commits(every + 1) == [False] * (every - 1) + [True, False]
    assert sync.probe_every == 2 * every
    took["s"] = 0.0001  # fast again: the next probe brings fsyncs back to the loop
    assert await durable_commits(2 * every + 2) == [False] * (2 * every - 1) + [True] * 3
    assert sync.synced == sync.committed
    assert sync.syncs == len(on_loop)


async def test_an_fsync_for_the_thread_is_under_way_before_the_writer_wakes_anyone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.server.store import wal_sync

    called = threading.Event()

    def timed(path: Path) -> float:
        called.set()
        return 0.02  # a slow disk: fsyncs stay on the thread

    monkeypatch.setattr(wal_sync.WalFile, "fsync", lambda held: timed(held.path))
    sync = wal_sync.WalSync(tmp_path / "x.db-wal")
    sync.start(sync.mark())
    assert not called.is_set(), "on the loop (nothing known yet) it waits for wait()"
    await sync.wait(sync.committed)
    assert sync.average_s >= wal_sync.INLINE_BELOW_S  # now the thread's
    called.clear()
    position = sync.mark()
    sync.start(position)
    await asyncio.sleep(0)  # one turn: the task hands the fsync to the thread ...
    assert await asyncio.to_thread(called.wait, 5.0), "... before anyone waits for it"
    await sync.wait(position)
    assert sync.synced == position


async def test_a_configured_normal_or_off_never_fsyncs(tmp_path: Path) -> None:
    for level, want in (("OFF", 0), ("NORMAL", NORMAL)):
        db = Database(parse_db(str(tmp_path / f"{level}.db")), sqlite_synchronous=level)
        await db.prepare()
        try:
            assert db.wal_sync is None
            assert await _level(db, durable=False) == want
            assert await _level(db) == want
        finally:
            await db.close()


async def test_commits_checkpoint_only_past_the_larger_wal(tmp_path: Path) -> None:
    """Every connection (the kept writer's and the readers') checkpoints at 4,000 WAL pages,
    not SQLite's 1,000: a commit of about 1,500 pages leaves them in the WAL."""
    db = Database(parse_db(str(tmp_path / "k.db")), wal_prefill=False)  # the WAL as it grows
    await db.prepare()
    try:
        async with db.write() as conn:
            pages = (await conn.execute(sa.text("PRAGMA wal_autocheckpoint"))).scalar_one()
            await conn.execute(sa.text("CREATE TABLE filler (b BLOB)"))
        async with db.read() as conn:
            read = (await conn.execute(sa.text("PRAGMA wal_autocheckpoint"))).scalar_one()
        assert pages == read == WAL_AUTOCHECKPOINT_PAGES == 4000
        for _ in range(3):  # three commits of about 500 pages each
            async with db.write() as conn:
                await conn.execute(
                    sa.text("INSERT INTO filler VALUES (randomblob(4000))"), [{}] * 500
                )
        # Past SQLite's default, and still only in the WAL: the database file alone (read as
        # immutable, which ignores the WAL) has no table yet.
        assert (tmp_path / "k.db-wal").stat().st_size > 1_200 * 4096
        with sqlite3.connect(f"file:{tmp_path / 'k.db'}?immutable=1", uri=True) as raw:
            found = raw.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'filler'")
            assert found.fetchone() == (0,)
    finally:
        await db.close()


WAL_FULL_BYTES = WAL_HEADER_BYTES + WAL_AUTOCHECKPOINT_PAGES * (WAL_FRAME_HEADER_BYTES + 4096)


def _crash_copy(db_file: Path, into: Path) -> Path:
    """The files a ``kill -9`` of the server leaves (the database and its WAL, not the
    shared-memory index, which the next opener rebuilds from the WAL), copied while it is
    still open: the copy's path."""
    into.mkdir()
    copy = into / db_file.name
    copy.write_bytes(db_file.read_bytes())
    Path(f"{copy}-wal").write_bytes(Path(f"{db_file}-wal").read_bytes())
    return copy


def _rows_and_check(db_file: Path) -> tuple[int, str]:
    with sqlite3.connect(db_file) as raw:
        rows = raw.execute("SELECT count(*) FROM filler").fetchone()[0]
        return rows, raw.execute("PRAGMA integrity_check").fetchone()[0]


async def _fill(db: Database, rows: int, *, each: int = 100) -> None:
    for _ in range(rows // each):
        async with db.write() as conn:
            await conn.execute(sa.text("INSERT INTO filler VALUES (randomblob(3000))"), [{}] * each)


async def test_a_fresh_wal_is_zero_filled_once_and_commits_overwrite_it(tmp_path: Path) -> None:
    """At start the WAL is zero-filled to the size it reaches between checkpoints; commits
    then overwrite it in place (it never grows), and what they committed survives a crash
    (recovery stops at the first frame of zeros)."""
    db = Database(parse_db(str(tmp_path / "z.db")))
    await db.prepare()
    wal = tmp_path / "z.db-wal"
    try:
        assert wal.stat().st_size == WAL_FULL_BYTES
        async with db.write() as conn:
            await conn.execute(sa.text("CREATE TABLE filler (b BLOB)"))
        await _fill(db, 300)
        assert wal.stat().st_size == WAL_FULL_BYTES, "commits wrote inside the filled WAL"
        assert _rows_and_check(_crash_copy(tmp_path / "z.db", tmp_path / "crash")) == (300, "ok")
    finally:
        await db.close()
    assert not wal.exists(), "a clean close checkpoints and removes the WAL, as before"


async def test_a_restart_keeps_what_a_crashed_filled_wal_held_and_fills_no_further(
    tmp_path: Path,
) -> None:
    """A server killed after its WAL wrapped (a checkpoint, then commits from its start
    again over older frames and zeros): the next one recovers every committed row, and its
    prefill writes nothing into the WAL it found."""
    db = Database(parse_db(str(tmp_path / "r.db")))
    await db.prepare()
    try:
        async with db.write() as conn:
            await conn.execute(sa.text("CREATE TABLE filler (b BLOB)"))
        await _fill(db, 6_000)  # about 4,700 pages: past a checkpoint, into the WAL's start
        crashed = _crash_copy(tmp_path / "r.db", tmp_path / "crash")
    finally:
        await db.close()
    wal = Path(f"{crashed}-wal")
    before = wal.read_bytes()
    assert len(before) >= WAL_FULL_BYTES  # the commit that crossed the line went past it
    assert int.from_bytes(before[12:16], "big") >= 1, "the WAL was reset: it wrapped"
    restarted = Database(parse_db(str(crashed)))
    await restarted.prepare()
    try:
        assert wal.read_bytes() == before, "the prefill wrote nothing into a WAL it found"
        async with restarted.read() as conn:
            rows = (await conn.execute(sa.text("SELECT count(*) FROM filler"))).scalar_one()
        assert rows == 6_000
    finally:
        await restarted.close()
    assert _rows_and_check(crashed) == (6_000, "ok")


def test_prefill_writes_zeros_only_past_the_wals_end(tmp_path: Path) -> None:
    wal = tmp_path / "p.db-wal"
    sync = WalSync(wal)
    assert sync.prefill(4096) == 0
    assert not wal.exists(), "no WAL yet: SQLite makes it"
    wal.write_bytes(b"\x01" * 1000)
    assert sync.prefill(3 * PREFILL_CHUNK + 5) == 3 * PREFILL_CHUNK + 5 - 1000
    data = wal.read_bytes()
    assert data[:1000] == b"\x01" * 1000, "what SQLite wrote is never touched"
    assert len(data) == 3 * PREFILL_CHUNK + 5
    assert data[1000:] == bytes(len(data) - 1000)
    assert sync.prefill(4096) == 0
    assert wal.stat().st_size == len(data), "never shrinks"


async def test_a_server_told_not_to_prefill_leaves_the_wal_to_grow(tmp_path: Path) -> None:
    db = Database(parse_db(str(tmp_path / "g.db")), wal_prefill=False)
    await db.prepare()
    try:
        assert (tmp_path / "g.db-wal").stat().st_size < 100 * 4096
    finally:
        await db.close()


async def test_a_group_with_one_durable_unit_waits_for_the_disk(tmp_path: Path) -> None:
    world = await World.open(f"sqlite:///{tmp_path / 'w.db'}", tmp_path)
    try:
        group = world.plane.agents.updates
        sync = world.plane.rt.db.wal_sync
        assert sync is not None

        async def position(tx: Tx) -> int:
            return sync.committed + 1  # the commit this group is about to make

        relaxed = await asyncio.gather(
            group.run(position, durable=False), group.run(position, durable=False)
        )
        assert sync.synced < max(relaxed), "a relaxed group does not wait for an fsync"
        mixed = await asyncio.gather(group.run(position, durable=False), group.run(position))
        assert sync.synced >= max(mixed), "one durable unit makes the group wait for the disk"
    finally:
        await world.close()


async def test_a_trigger_after_a_quiet_spell_is_scheduled_at_once_and_bursts_are_paced(
    tmp_path: Path,
) -> None:
    world = await World.open(f"sqlite:///{tmp_path / 'w.db'}", tmp_path, debounce_s=60.0)
    loop = world.plane.schedule
    runner = asyncio.create_task(loop.run())

    async def cycles_reach(n: int) -> None:
        for _ in range(100):  # the virtual clock never moves: only an immediate cycle can run
            await asyncio.sleep(0.01)
            if loop.cycles >= n:
                break

    async def quiet_spell() -> None:
        # Cycles also start at least the last one's (wall-clock) length apart; a first cycle
        # can be long (imports, an fsync on the loop while it awaited): wait that out for real.
        await asyncio.sleep(loop.last_cycle_s + 0.01)

    try:
        await world.submit(resources={"gpus": 1})  # no node: it stays queued, alone
        await cycles_reach(1)
        assert loop.cycles == 1, "the first trigger waits for nothing"
        await quiet_spell()
        world.plane.rt.schedule_needed.fire()
        await cycles_reach(2)
        assert loop.cycles == 2, "one job waiting is no burst: the next cycle runs at once too"
        await quiet_spell()
        await world.submit(resources={"gpus": 1})  # now the cycle finds two: a burst
        await cycles_reach(3)
        assert loop.cycles == 3
        world.plane.rt.schedule_needed.fire()
        await asyncio.sleep(0.2)
        assert loop.cycles == 3, "the next cycle waits out the spacing (60 s of virtual time)"
        world.clock.advance(60.0)
        await cycles_reach(4)
        assert loop.cycles == 4
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await world.close()


@pytest.fixture
async def sqlite_world(tmp_path: Path) -> AsyncIterator[World]:
    """A world on a SQLite file (its WAL synced by ``WalSync``)."""
    world = await World.open(f"sqlite:///{tmp_path / 'w.db'}", tmp_path)
    try:
        yield world
    finally:
        await world.close()


class _Disk:
    """A slow disk whose fsyncs (on the WAL's thread) finish only when let through."""

    def __init__(self, sync: Any) -> None:
        self.gate = threading.Event()
        sync.inline_below_s = 0.0  # slow: every fsync goes to the thread

    def fsync(self, path: Path) -> float:
        assert self.gate.wait(10), "the test never let the fsync through"
        return 0.0


async def _woken(ticket: Any) -> bool:
    try:
        async with asyncio.timeout(5):
            await ticket.woken.wait()
    except TimeoutError:
        return False
    return True


async def test_an_agents_end_reaches_readers_at_its_commit_and_its_ack_waits_for_the_disk(
    sqlite_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.server.store import wal_sync

    world = sqlite_world
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1", gpus=1)
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    rt = world.plane.rt
    disk = _Disk(rt.db.wal_sync)
    monkeypatch.setattr(wal_sync.WalFile, "fsync", lambda held: disk.fsync(held.path))
    ticket = rt.wakeups.ticket(job_id=job.job.id)
    ticket_from = max(e.seq for e in await world.events(job.job.id))

    ack = asyncio.create_task(agent.finish(a, {job.job.id: {"out.txt": b"ok"}}))
    assert await _woken(ticket), "the end's events were published before its fsync"
    assert not ack.done(), "the agent's ack waits for the disk (it keeps the report)"
    seen = rt.recent.after(ticket_from, job_id=job.job.id, team=None, limit=100)
    assert seen is not None
    assert seen[-1][0].kind is EventKind.JOB_SUCCEEDED
    assert (await world.job(job.job.id)).state is JobState.SUCCEEDED

    disk.gate.set()
    assert await ack is Ack.ACCEPTED
    assert rt.db.wal_sync is not None
    assert rt.db.wal_sync.synced == rt.db.wal_sync.committed


async def test_a_group_publishes_its_early_units_events_at_commit_and_the_rest_once_on_disk(
    sqlite_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.server.store import wal_sync

    world = sqlite_world
    rt, group = world.plane.rt, world.plane.agents.updates

    def logging(job_id: str) -> Any:
        async def unit(tx: Tx) -> None:
            tx.emit(EventKind.JOB_LOG, team="default", job_id=job_id, lines=["x"])

        return unit

    await group.run(logging("first"))  # takes the start's jump of event numbers (on disk)
    disk = _Disk(rt.db.wal_sync)
    monkeypatch.setattr(wal_sync.WalFile, "fsync", lambda held: disk.fsync(held.path))
    early, late = rt.wakeups.ticket(job_id="early"), rt.wakeups.ticket(job_id="late")
    after = rt.wakeups.ticket(job_id="after")
    # Queued together, the three share a group. The early unit (an agent's report) runs
    # first whatever the order they came in: its events go out at the commit, the
    # submission-like units' (not early) once the group is on disk.
    both = asyncio.gather(
        group.run(logging("late")),
        group.run(logging("early"), early=True),
        group.run(logging("after")),
    )
    assert await _woken(early), "the early unit's events were held for the fsync"
    assert not late.woken.is_set()
    assert not after.woken.is_set()
    disk.gate.set()
    await both
    assert await _woken(late)
    assert await _woken(after)
    logged = [e for e in await world.events() if e.kind is EventKind.JOB_LOG]
    assert [e.job_id for e in logged] == ["first", "early", "late", "after"]  # numbered so


async def test_an_early_units_events_wait_for_an_earlier_changes_fsync(
    sqlite_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.server.store import wal_sync

    world = sqlite_world
    rt, group = world.plane.rt, world.plane.agents.updates

    def logging(job_id: str) -> Any:
        async def unit(tx: Tx) -> None:
            tx.emit(EventKind.JOB_LOG, team="default", job_id=job_id, lines=["x"])

        return unit

    await group.run(logging("first"))
    disk = _Disk(rt.db.wal_sync)
    monkeypatch.setattr(wal_sync.WalFile, "fsync", lambda held: disk.fsync(held.path))
    late, early = rt.wakeups.ticket(job_id="late"), rt.wakeups.ticket(job_id="early")
    first = asyncio.create_task(group.run(logging("late")))  # a group of its own, on disk next
    await asyncio.sleep(0.05)
    second = asyncio.create_task(group.run(logging("early"), early=True))
    await asyncio.sleep(0.2)
    # A reader given the early event (a higher number) would skip the one still held back.
    assert not early.woken.is_set()
    assert not late.woken.is_set()
    disk.gate.set()
    await asyncio.gather(first, second)
    assert early.woken.is_set()
    assert late.woken.is_set()


async def test_the_next_group_commits_while_the_last_one_waits_for_the_disk(
    sqlite_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.server.store import wal_sync

    world = sqlite_world
    rt, group = world.plane.rt, world.plane.agents.updates
    sync = rt.db.wal_sync
    assert sync is not None

    async def position(tx: Tx) -> int:
        return sync.committed + 1  # the commit this group is about to make

    await group.run(position)
    disk = _Disk(sync)
    monkeypatch.setattr(wal_sync.WalFile, "fsync", lambda held: disk.fsync(held.path))
    waiting = asyncio.create_task(group.run(position))  # a durable group: its fsync is held
    await asyncio.sleep(0.05)
    async with asyncio.timeout(5):
        relaxed = await group.run(position, durable=False)
    assert relaxed > sync.synced, "committed while the group before it waited for the disk"
    assert not waiting.done()
    disk.gate.set()
    assert await waiting <= sync.synced


async def test_a_restarted_sqlite_server_numbers_its_events_past_any_a_crash_forgot(
    tmp_path: Path,
) -> None:
    from corral.server.store.events import SEQ_JUMP

    url = f"sqlite:///{tmp_path / 'w.db'}"
    world = await World.open(url, tmp_path)
    try:
        first = await world.submit(resources={"gpus": 1})
        before = max(e.seq for e in await world.events())
        assert min(e.seq for e in await world.events()) == SEQ_JUMP  # a first start jumps too
    finally:
        await world.close()
    world = await World.open(url, tmp_path)  # a restart (after a power loss, say)
    try:
        await world.submit(resources={"gpus": 1})
        await world.submit(resources={"gpus": 1})
        seqs = sorted(e.seq for e in await world.events() if e.job_id != first.job.id)
        assert seqs[0] == before + SEQ_JUMP, "the first event after the start jumps ..."
        assert seqs[1:] == list(range(seqs[0] + 1, seqs[0] + len(seqs))), "... the next follow"
    finally:
        await world.close()


async def test_the_jump_is_kept_for_the_next_event_when_its_change_rolls_back(
    sqlite_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.server.services import publishing

    world = sqlite_world
    db = world.plane.rt.db
    jump = db.event_jump
    assert jump > 0, "set by the start, not taken yet"

    async def logging(tx: Tx) -> None:
        tx.emit(EventKind.JOB_LOG, team="default", job_id="x", lines=["lost"])

    async def failing(tx: Tx) -> None:
        await logging(tx)
        raise RuntimeError("this change fails before its events are written")

    with pytest.raises(RuntimeError):
        await world.plane.agents.updates.run(failing)
    assert db.event_jump == jump
    real = publishing.event_repo.append

    async def append_then_fail(*args: Any, **kwargs: Any) -> list[int]:
        await real(*args, **kwargs)  # the jump is taken here ...
        raise RuntimeError("... and the transaction rolls back")

    monkeypatch.setattr(publishing.event_repo, "append", append_then_fail)
    with pytest.raises(RuntimeError):
        await world.plane.agents.updates.run(logging)
    monkeypatch.setattr(publishing.event_repo, "append", real)
    assert db.event_jump == jump, "nothing committed: the jump waits for the next event"
    await world.submit(resources={"gpus": 1})
    assert db.event_jump == 0
    assert min(e.seq for e in await world.events()) == jump  # the first that committed


@pytest.mark.parametrize("kind", ["relaxed", "early"])
async def test_the_change_taking_the_jump_publishes_only_from_the_disk(
    sqlite_world: World, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    from corral.server.store import wal_sync

    world = sqlite_world
    rt, group = world.plane.rt, world.plane.agents.updates
    assert rt.db.event_jump > 0, "the start's jump is still to be taken"
    disk = _Disk(rt.db.wal_sync)
    monkeypatch.setattr(wal_sync.WalFile, "fsync", lambda held: disk.fsync(held.path))

    async def logging(tx: Tx) -> None:
        tx.emit(EventKind.JOB_LOG, team="default", job_id="first", lines=["x"])

    ticket = rt.wakeups.ticket(job_id="first")
    # A relaxed or early change publishes before its fsync; the first after a start must not:
    # a power loss would forget its jump and the next start would hand its numbers out again.
    unit = (
        group.run(logging, durable=False) if kind == "relaxed" else group.run(logging, early=True)
    )
    running = asyncio.ensure_future(unit)
    await asyncio.sleep(0.2)
    assert rt.db.event_jump == 0, "taken and committed"
    assert not ticket.woken.is_set(), "published before the jump was on disk"
    disk.gate.set()
    await running
    assert ticket.woken.is_set()
    later = rt.wakeups.ticket(job_id="later")
    disk.gate.clear()

    async def more(tx: Tx) -> None:
        tx.emit(EventKind.JOB_LOG, team="default", job_id="later", lines=["y"])

    await group.run(more, durable=False)  # the jump taken, relaxed changes publish at once
    assert later.woken.is_set()
