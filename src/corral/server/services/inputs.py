"""Input files: blobs clients upload for their jobs to read (docs/server.md, "Input files").

A file arrives streamed (``POST /v1/inputs``, or the drop-in ComfyUI ``/upload/image``):
it is written to a scratch file and hashed as it comes, so a large image never sits in
memory, and refused past ``inputs.max_bytes``. Files are content-addressed: the bytes
live once under ``inputs/<sha256>`` however many callers upload them, and each owner
(a team, or the admin) has its own row for them, so a team may name in its jobs only
the files it uploaded itself (the sha256 of someone else's file is no key to it).

A job names its inputs (``inputs: [{"blob": sha256, "name": "photo.png"}]``); they are
checked at submission (422 naming the field) and ship with the job's assignment; the
agent downloads them (``FetchBlob``, allowed only to an allocation whose job names the
file) and hands them to its backend. Each owner holds at most ``inputs.max_files`` files
and ``inputs.max_stored_bytes`` bytes. A file nobody uploaded or named in a job for
``inputs.retention_s`` is deleted by the sweep, unless a job that has not ended names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corral.core.errors import InvalidSpec, NotFound, QuotaExceeded, TooLarge
from corral.core.model import DEFAULT_TEAM, InputFile
from corral.core.states import JOB, JobState
from corral.server.services.auth import Principal
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store.tables import input_names, inputs, jobs

log = logging.getLogger("corral.server.inputs")

PREFIX = "inputs"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
NAME = re.compile(r"^[^/\\\x00-\x1f]{1,255}$")
"""A file name: no folders (a name is only what the job calls it), no control characters."""


@dataclass(frozen=True, slots=True)
class StoredInput:
    sha256: str
    size: int
    name: str
    mime: str
    created_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "blob": self.sha256,
            "size": self.size,
            "name": self.name,
            "mime": self.mime,
            "created_at": self.created_at,
        }


def owner_of(who: Principal) -> str:
    """Whose files these are: the admin's, or a team's (every token of a team shares them,
    as they share the team's jobs)."""
    return "admin" if who.is_admin else f"team:{who.team or DEFAULT_TEAM}"


def blob_key(sha256: str) -> str:
    return f"{PREFIX}/{sha256}"


def input_sha(blob_id: str) -> str | None:
    """The sha256 of ``inputs/<sha256>`` (an agent fetching an input file), else None."""
    prefix, _, sha = blob_id.partition("/")
    return sha if prefix == PREFIX and SHA256.match(sha) else None


def check_name(name: str, field: str = "name") -> str:
    if not NAME.match(name) or name in (".", ".."):
        raise InvalidSpec(field, "a file name of 1-255 characters, without '/', '\\' or controls")
    return name


class InputService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.settings = rt.settings.inputs

    async def receive(
        self, who: Principal, chunks: AsyncIterator[bytes], name: str, mime: str
    ) -> StoredInput:
        """Store one uploaded file (streamed) for ``who``; the same bytes again are the same
        file (its name and time of first upload kept, its retention renewed)."""
        who.require_client()
        check_name(name)
        owner = owner_of(who)
        scratch = self.rt.blobs.scratch(f"input-{secrets.token_hex(8)}")
        try:
            size, sha = await self._spool(chunks, scratch)
            found = await self._row(owner, sha)
            if found is None:  # caps count files: bytes it holds already are no new one
                await self._room(owner, size)
            if self.rt.blobs.path(blob_key(sha)) is None:
                await self.rt.blobs.put_file(blob_key(sha), scratch)
        finally:
            scratch.unlink(missing_ok=True)
        return await self._record(owner, sha, size, name, mime[:128] or "application/octet-stream")

    async def _spool(self, chunks: AsyncIterator[bytes], into: Path) -> tuple[int, str]:
        """Write the stream to ``into`` (the writes in a thread), hashing it as it comes."""
        limit, sha, size = self.settings.max_bytes, hashlib.sha256(), 0
        with into.open("wb") as out:
            async for piece in chunks:
                size += len(piece)
                if size > limit:
                    raise TooLarge(
                        f"the file is over the limit of {limit} bytes (inputs.max_bytes)"
                    )
                sha.update(piece)
                await asyncio.to_thread(out.write, piece)
        return size, sha.hexdigest()

    async def _room(self, owner: str, size: int) -> None:
        """Refuse a new file that would take ``owner`` past its caps."""
        async with self.rt.db.read() as conn:
            row = (
                await conn.execute(
                    sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(inputs.c.size), 0))
                    .select_from(inputs)
                    .where(inputs.c.owner == owner)
                )
            ).one()
        count, stored = int(row[0]), int(row[1])
        cap_files, cap_bytes = self.settings.max_files, self.settings.max_stored_bytes
        if count >= cap_files:
            raise QuotaExceeded(
                f"{owner} holds {count} input files, the most allowed (inputs.max_files); "
                "delete some (DELETE /v1/inputs/<blob>) or wait for retention"
            )
        if stored + size > cap_bytes:
            raise QuotaExceeded(
                f"{owner} holds {stored} bytes of input files; this one would pass the cap of "
                f"{cap_bytes} (inputs.max_stored_bytes)"
            )

    async def _row(self, owner: str, sha: str) -> Any | None:
        async with self.rt.db.read() as conn:
            query = sa.select(inputs).where(inputs.c.owner == owner, inputs.c.sha256 == sha)
            return (await conn.execute(query)).first()

    async def _record(self, owner: str, sha: str, size: int, name: str, mime: str) -> StoredInput:
        async with self.rt.tx() as tx:
            now = tx.now
            found = (
                await tx.conn.execute(
                    sa.select(inputs).where(inputs.c.owner == owner, inputs.c.sha256 == sha)
                )
            ).first()
            if found is None:
                values = dict(owner=owner, sha256=sha, size=size, name=name, mime=mime)
                await tx.conn.execute(
                    sa.insert(inputs).values(**values, created_at=now, used_at=now)
                )
                return StoredInput(sha, size, name, mime, now)
            await tx.conn.execute(
                sa.update(inputs)
                .where(inputs.c.owner == owner, inputs.c.sha256 == sha)
                .values(used_at=now)
            )
        return StoredInput(sha, found.size, found.name, found.mime, found.created_at)

    async def get(self, who: Principal, sha: str) -> StoredInput:
        """One of ``who``'s files; NotFound for any other (its existence is not told)."""
        who.require_client()
        row = await self._row(owner_of(who), sha) if SHA256.match(sha) else None
        if row is None:
            raise NotFound(f"input file {sha} not found")
        return StoredInput(row.sha256, row.size, row.name, row.mime, row.created_at)

    async def delete(self, who: Principal, sha: str) -> None:
        """Forget ``who``'s file; its bytes go once no owner has it (a job that names it and
        has not run yet fails for want of it)."""
        await self.get(who, sha)
        async with self.rt.tx() as tx:
            await tx.conn.execute(
                sa.delete(inputs).where(inputs.c.owner == owner_of(who), inputs.c.sha256 == sha)
            )
            await tx.conn.execute(
                sa.delete(input_names).where(
                    input_names.c.owner == owner_of(who), input_names.c.sha256 == sha
                )
            )
        await self._drop_unowned([sha])

    async def check(
        self, who: Principal, files: Sequence[InputFile], field: str = "inputs"
    ) -> None:
        """Refuse a job naming a file ``who`` did not upload (InvalidSpec naming the entry);
        renew the retention of those it names."""
        if not files:
            return
        owner, wanted = owner_of(who), sorted({f.sha256 for f in files})
        async with self.rt.db.read() as conn:
            query = sa.select(inputs.c.sha256).where(inputs.c.sha256.in_(wanted))
            if not who.is_admin:  # the operator's jobs may read any file on its server
                query = query.where(inputs.c.owner == owner)
            held = {row.sha256 for row in await conn.execute(query)}
        for i, f in enumerate(files):
            if f.sha256 not in held:
                raise InvalidSpec(
                    f"{field}[{i}].blob",
                    f"no input file {f.sha256} of yours: upload it first (POST /v1/inputs)",
                )
        async with self.rt.tx(durable=False) as tx:
            await tx.conn.execute(
                sa.update(inputs)
                .where(inputs.c.sha256.in_(wanted), inputs.c.owner == owner)
                .values(used_at=tx.now)
            )

    async def may_fetch(self, allocation_id: str, attempt: int, sha: str) -> bool:
        """Only a live allocation of a job that names the file may download it."""
        async with self.rt.db.read() as conn:
            rec = await alloc_repo.get(conn, allocation_id)
            if rec is None or rec.alloc.attempt != attempt or not rec.alloc.active:
                return False
            found = await job_repo.get_many(conn, rec.alloc.job_ids)
        return any(f.sha256 == sha for r in found.values() for f in r.job.inputs)

    async def sweep(self) -> int:
        """Delete files unused for ``inputs.retention_s`` that no unended job names; how many
        rows went."""
        cutoff = self.rt.clock.now() - self.settings.retention_s
        async with self.rt.db.read() as conn:
            query = sa.select(inputs.c.owner, inputs.c.sha256).where(inputs.c.used_at < cutoff)
            stale = [(row.owner, row.sha256) for row in await conn.execute(query.limit(1000))]
            if not stale:
                return 0
            needed = await _named_by_unended_jobs(conn, {sha for _, sha in stale})
        doomed = [(o, s) for o, s in stale if s not in needed]
        async with self.rt.tx() as tx:
            for owner, sha in doomed:
                await tx.conn.execute(
                    sa.delete(inputs).where(
                        inputs.c.owner == owner, inputs.c.sha256 == sha, inputs.c.used_at < cutoff
                    )
                )
                await tx.conn.execute(
                    sa.delete(input_names).where(
                        input_names.c.owner == owner, input_names.c.sha256 == sha
                    )
                )
        await self._drop_unowned(sorted({s for _, s in doomed}))
        return len(doomed)

    async def _drop_unowned(self, shas: Sequence[str]) -> None:
        if not shas:
            return
        async with self.rt.db.read() as conn:
            query = sa.select(inputs.c.sha256).where(inputs.c.sha256.in_(list(shas)))
            owned = {row.sha256 for row in await conn.execute(query)}
        for sha in shas:
            if sha not in owned:
                with contextlib.suppress(OSError):  # the next sweep tries again
                    await self.rt.blobs.delete(blob_key(sha))


async def _named_by_unended_jobs(conn: Any, shas: set[str]) -> set[str]:
    """Those of ``shas`` a job that has not ended names. Only jobs whose spec names an
    input are decoded (a text match on the spec narrows them first)."""
    unended = [s.value for s in JobState if s not in JOB.terminal]
    query = sa.select(jobs.c.spec).where(
        jobs.c.state.in_(unended), sa.cast(jobs.c.spec, sa.Text).like('%"inputs"%')
    )
    named: set[str] = set()
    for row in await conn.execute(query):
        spec = row.spec if isinstance(row.spec, dict) else {}
        named |= {sha for _, sha in spec.get("inputs") or ()}
    return named & shas
