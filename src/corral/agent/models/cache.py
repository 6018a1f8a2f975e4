"""The model cache: a directory of verified files under a disk budget.

Layout (see docs/models.md)::

    <root>/index.json              names -> sha256, sizes, last use (written atomically)
    <root>/blobs/<sha256>          complete files whose sha256 was checked
    <root>/partial/<sha256>.part   downloads in progress or interrupted (resumable)

Files are content-addressed, so two names for the same bytes share one file,
a partial download resumes from any source, and a model whose registry
entry changes gets a new file while a job may still use the old one.

Accounting: every byte on disk or promised counts against ``budget``:
complete files, partial files nobody is fetching, and a *reservation* of the
full size for each download in flight. Before a download starts it reserves
its size; ``plan_eviction`` (pure) picks what to delete, never a pinned model,
and when nothing more can go the reservation fails with ``CacheFull``.

The cache is used from one asyncio event loop; its methods do not await
except where they hash a file (in a worker thread).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from corral.agent.models.errors import CacheFull, IntegrityError, ModelError
from corral.agent.models.eviction import Candidate, Rank, plan_eviction
from corral.agent.models.index import (
    INDEX_NAME,
    BlobEntry,
    Index,
    ModelEntry,
    fsync_dir,
    load_index,
    save_index,
)
from corral.agent.models.spec import ModelKind, ModelSpec
from corral.core import Clock

log = logging.getLogger(__name__)
HASH_BLOCK = 1024 * 1024  # read size when hashing a file: large enough to be disk-bound


@dataclass(frozen=True, slots=True)
class CachedModel:
    """A model on disk, as the inventory and the dashboard show it."""

    name: str
    sha256: str
    size: int
    kind: ModelKind
    backend: str
    path: Path
    last_used_at: float
    pinned: bool


class ModelCache:
    """Verified model files under ``root``, at most ``budget`` bytes in all."""

    def __init__(
        self, root: Path, budget: int, clock: Clock, *, touch_flush_s: float = 30.0
    ) -> None:
        if budget <= 0:
            raise ValueError(f"budget must be a positive number of bytes, got {budget}")
        self.root = root
        self.budget = budget
        self._clock = clock
        self._touch_flush_s = touch_flush_s  # how stale the on-disk LRU order may get
        self._pins: Counter[str] = Counter()  # sha256 -> jobs using it
        self._reserved: dict[str, tuple[str, int]] = {}  # sha256 -> (model, bytes)
        self._dirty = False
        self._saved_at = clock.now()
        self.notes: list[str] = []  # what loading found and repaired, for the agent's log
        self._index = self._load()

    # ---- what is here -------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        """Bytes counted against the budget: files, idle partials and reservations."""
        blobs = sum(b.size for b in self._index.blobs.values())
        reserved = sum(size for _, size in self._reserved.values())
        return blobs + reserved + sum(size for _, size in self._idle_partials())

    def has(self, spec: ModelSpec) -> bool:
        """Whether ``spec``'s exact file (by sha256) is here under its name."""
        entry = self._index.models.get(spec.name)
        return entry is not None and entry.sha256 == spec.sha256

    def lookup(self, name: str) -> CachedModel | None:
        entry = self._index.models.get(name)
        if entry is None:
            return None
        blob = self._index.blobs[entry.sha256]
        return CachedModel(
            name=name,
            sha256=entry.sha256,
            size=blob.size,
            kind=entry.kind,
            backend=entry.backend,
            path=self.blob_path(entry.sha256),
            last_used_at=blob.last_used_at,
            pinned=self._pins[entry.sha256] > 0,
        )

    def models(self) -> list[CachedModel]:
        """Every model on disk, most recently used first."""
        found = [m for name in self._index.models if (m := self.lookup(name))]
        return sorted(found, key=lambda m: -self._index.blobs[m.sha256].last_used)

    def on_disk(self) -> tuple[str, ...]:
        """The model names this node reports as ``models_on_disk`` in its inventory."""
        return tuple(sorted(self._index.models))

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def part_path(self, sha256: str) -> Path:
        return self.root / "partial" / f"{sha256}.part"

    # ---- using a model ------------------------------------------------------

    def pin(self, name: str) -> str:
        """Mark ``name``'s file in use (never evicted) and touch it; returns its sha256."""
        entry = self._index.models.get(name)
        if entry is None:
            raise ModelError(name, f"model {name} is not in the cache")
        self._pins[entry.sha256] += 1
        self._touch(entry.sha256)
        return entry.sha256

    def unpin(self, sha256: str) -> None:
        """Release one ``pin``; the file becomes evictable when nobody uses it."""
        if self._pins[sha256] <= 0:
            raise ValueError(f"{sha256} is not pinned")
        self._pins[sha256] -= 1
        if sha256 in self._index.blobs:
            self._touch(sha256)

    @asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[Path]:
        """``async with cache.use("sdxl-base") as path``: pinned for the block's duration."""
        sha = self.pin(name)
        try:
            yield self.blob_path(sha)
        finally:
            self.unpin(sha)

    def link(self, spec: ModelSpec) -> bool:
        """Point ``spec.name`` at a file already here with its sha256; False when none is."""
        if spec.sha256 not in self._index.blobs:
            return False
        entry = ModelEntry(spec.name, spec.sha256, spec.kind, spec.backend)
        if self._index.models.get(spec.name) != entry:
            self._index.models[spec.name] = entry
            self._save()
        return True

    # ---- making room and adding files ---------------------------------------

    def reserve(self, spec: ModelSpec) -> None:
        """Promise ``spec.size`` bytes to a download, evicting what must go; or ``CacheFull``."""
        if spec.sha256 in self._reserved or spec.sha256 in self._index.blobs:
            return  # already promised, or already here: nothing more will be written
        self._make_room(spec.size, spec)
        self._reserved[spec.sha256] = (spec.name, spec.size)

    def release(self, sha256: str) -> None:
        """Drop a reservation (the download stopped); its partial file stays, evictable."""
        self._reserved.pop(sha256, None)

    def commit(self, spec: ModelSpec) -> Path:
        """Move a verified partial file into ``blobs/`` and point ``spec.name`` at it."""
        target = self.blob_path(spec.sha256)
        os.replace(self.part_path(spec.sha256), target)
        fsync_dir(target.parent)
        use = self._index.next_use()
        now = self._clock.now()
        self._index.blobs[spec.sha256] = BlobEntry(spec.sha256, spec.size, now, now, use)
        self._index.models[spec.name] = ModelEntry(spec.name, spec.sha256, spec.kind, spec.backend)
        self.release(spec.sha256)
        self._save()
        return target

    def remove(self, name: str) -> None:
        """Forget ``name``; its file goes too unless another name or a job still uses it."""
        entry = self._index.models.pop(name, None)
        if entry is None:
            return
        if not self._index.names_of(entry.sha256) and not self._pins[entry.sha256]:
            self._delete_blob(entry.sha256)
        self._save()

    async def verify(self, name: str) -> None:
        """Re-hash ``name``'s file; a mismatch deletes it and raises ``IntegrityError``."""
        entry = self._index.models.get(name)
        if entry is None:
            raise ModelError(name, f"model {name} is not in the cache")
        path = self.blob_path(entry.sha256)
        actual = await asyncio.to_thread(sha256_of, path)
        if actual != entry.sha256:
            self._delete_blob(entry.sha256)
            self._save()
            raise IntegrityError(name, entry.sha256, actual, f"the cache file {path}")

    async def verify_all(self) -> list[IntegrityError]:
        """Re-hash every file; returns what was corrupt (and is now deleted)."""
        bad: list[IntegrityError] = []
        for name in list(self._index.models):
            if name not in self._index.models:  # went with a corrupt file shared by names
                continue
            try:
                await self.verify(name)
            except IntegrityError as exc:
                bad.append(exc)
        return bad

    def flush(self) -> None:
        """Write pending use times (the LRU order) to the index now."""
        if self._dirty:
            self._save()

    # ---- helpers ------------------------------------------------------------

    def _make_room(self, need: int, spec: ModelSpec | None) -> None:
        own = spec.sha256 if spec else ""
        candidates = self._candidates(exclude_partial=own)
        own_partial = self.part_path(own).stat().st_size if spec and self._has_part(own) else 0
        used = self.used_bytes - own_partial  # the reservation will cover our own partial
        plan = plan_eviction(candidates, used=used, budget=self.budget, need=need)
        if not plan.fits:
            held = {c.label: c.size for c in plan.held}
            held |= {f"{model} (downloading)": size for model, size in self._reserved.values()}
            raise CacheFull(spec.name if spec else "?", need, self.budget, held)
        for victim in plan.victims:
            if victim.rank is Rank.PARTIAL:
                self.part_path(victim.key.removeprefix("partial:")).unlink(missing_ok=True)
            else:
                self._delete_blob(victim.key)
            log.info("evicted %s (%d bytes) to make room", victim.label, victim.size)
        if plan.victims:
            self._save()

    def _candidates(self, *, exclude_partial: str) -> list[Candidate]:
        found = [
            Candidate(f"partial:{sha}", size, Rank.PARTIAL, 0, label=f"partial {sha[:12]}")
            for sha, size in self._idle_partials()
            if sha != exclude_partial
        ]
        for sha, blob in self._index.blobs.items():
            names = self._index.names_of(sha)
            rank = Rank.MODEL if names else Rank.ORPHAN
            label = ", ".join(names) or f"old file {sha[:12]}"
            found.append(
                Candidate(sha, blob.size, rank, blob.last_used, self._pins[sha] > 0, label)
            )
        return found

    def _idle_partials(self) -> list[tuple[str, int]]:
        """Partial files no download is fetching now: (sha256, size)."""
        found = []
        for part in (self.root / "partial").glob("*.part"):
            sha = part.name.removesuffix(".part")
            if sha not in self._reserved:
                found.append((sha, part.stat().st_size))
        return found

    def _has_part(self, sha256: str) -> bool:
        return bool(sha256) and self.part_path(sha256).exists()

    def _delete_blob(self, sha256: str) -> None:
        self.blob_path(sha256).unlink(missing_ok=True)
        self._index.blobs.pop(sha256, None)
        for name in self._index.names_of(sha256):
            del self._index.models[name]

    def _touch(self, sha256: str) -> None:
        blob = self._index.blobs[sha256]
        blob.last_used = self._index.next_use()
        blob.last_used_at = self._clock.now()
        self._dirty = True
        if self._clock.now() - self._saved_at >= self._touch_flush_s:
            self._save()

    def _save(self) -> None:
        save_index(self.root / INDEX_NAME, self._index)
        self._dirty = False
        self._saved_at = self._clock.now()

    def _load(self) -> Index:
        for sub in ("blobs", "partial"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / f".{INDEX_NAME}.tmp").unlink(missing_ok=True)  # a write that never finished
        index, note = load_index(self.root / INDEX_NAME)
        if note:
            self.notes.append(note)
        self._index = index
        changed = self._reconcile()
        self._make_room(0, None)  # the budget may have shrunk since the last run
        if changed or note:
            self._save()
        return index

    def _reconcile(self) -> bool:
        """Make the index agree with the files; returns whether anything changed."""
        index, before = self._index, len(self.notes)
        for sha, blob in list(index.blobs.items()):
            path = self.blob_path(sha)
            size = path.stat().st_size if path.exists() else None
            if size != blob.size:
                why = "is missing" if size is None else f"has {size} bytes, not {blob.size}"
                self.notes.append(f"dropped {', '.join(index.names_of(sha)) or sha}: file {why}")
                self._delete_blob(sha)
        for name, entry in list(index.models.items()):
            if entry.sha256 not in index.blobs:
                del index.models[name]
        for path in (self.root / "blobs").iterdir():
            if path.name not in index.blobs:
                self._quarantine(path)
        for path in (self.root / "partial").iterdir():
            if not _is_sha(path.name.removesuffix(".part")) or path.suffix != ".part":
                path.unlink()
                self.notes.append(f"deleted stray file partial/{path.name}")
        return len(self.notes) > before

    def _quarantine(self, path: Path) -> None:
        """A file in ``blobs/`` the index does not know: re-check it as a partial download.

        It is there because a crash hit between moving a verified file in and
        writing the index. As a partial of full length it is hashed again by the
        next download of that sha256 and adopted without any network traffic.
        """
        if _is_sha(path.name) and path.is_file():
            os.replace(path, self.part_path(path.name))
            self.notes.append(f"unindexed file {path.name[:12]} kept as a partial to re-verify")
        else:
            path.unlink()
            self.notes.append(f"deleted stray file blobs/{path.name}")


def sha256_of(path: Path, limit: int | None = None) -> str:
    """The hex sha256 of ``path`` (of its first ``limit`` bytes when given)."""
    return hash_prefix(path, limit)[0].hexdigest()


def hash_prefix(path: Path, limit: int | None = None) -> tuple[hashlib._Hash, int]:
    """A sha256 fed with the first ``limit`` bytes of ``path`` (all when None), and the count."""
    digest, done = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while limit is None or done < limit:
            block = f.read(HASH_BLOCK if limit is None else min(HASH_BLOCK, limit - done))
            if not block:
                break
            digest.update(block)
            done += len(block)
    return digest, done


def _is_sha(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)
