"""The cache's index file: which names point to which files, and when each was used.

``index.json`` in the cache directory is the only state besides the files. It
is written atomically (a temporary file in the same directory, flushed to
disk, then renamed over the old one), so a crash leaves either the old or the
new index, never half of one. An index that cannot be read anyway (disk
trouble, a hand edit) is moved aside and the cache rebuilds from the files it
finds: they become orphans that a later request with the same sha256 adopts.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corral.agent.models.spec import ModelKind

INDEX_VERSION = 1
INDEX_NAME = "index.json"


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A registry name the cache knows, and the file (by sha256) it points to."""

    name: str
    sha256: str
    kind: ModelKind = ModelKind.CHECKPOINT
    backend: str = ""


@dataclass(slots=True)
class BlobEntry:
    """One complete, verified file in ``blobs/``."""

    sha256: str
    size: int
    added_at: float  # clock time it arrived
    last_used_at: float  # clock time it was last used, for people
    last_used: int  # logical use counter, for the LRU order (robust to clock jumps)


@dataclass(slots=True)
class Index:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    blobs: dict[str, BlobEntry] = field(default_factory=dict)
    uses: int = 0  # the logical use counter's current value

    def names_of(self, sha256: str) -> list[str]:
        return sorted(m.name for m in self.models.values() if m.sha256 == sha256)

    def next_use(self) -> int:
        self.uses += 1
        return self.uses


def load_index(path: Path) -> tuple[Index, str]:
    """Read the index; on trouble, move it aside and return an empty one and a note why."""
    if not path.exists():
        return Index(), ""
    try:
        return _decode(json.loads(path.read_text(encoding="utf-8"))), ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        aside = path.with_name(f"{path.name}.unreadable")
        os.replace(path, aside)
        return Index(), f"index unreadable ({type(exc).__name__}: {exc}); moved to {aside.name}"


def save_index(path: Path, index: Index) -> None:
    """Write ``index`` atomically: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    data = json.dumps(_encode(index), indent=1, sort_keys=True).encode()
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _encode(index: Index) -> dict[str, Any]:
    return {
        "version": INDEX_VERSION,
        "uses": index.uses,
        "models": {name: asdict(m) for name, m in sorted(index.models.items())},
        "blobs": {sha: asdict(b) for sha, b in sorted(index.blobs.items())},
    }


def _decode(raw: Any) -> Index:
    if not isinstance(raw, dict) or raw.get("version") != INDEX_VERSION:
        raise ValueError(f"not a version {INDEX_VERSION} index")
    models = {
        name: ModelEntry(
            name=name, sha256=m["sha256"], kind=ModelKind(m["kind"]), backend=m["backend"]
        )
        for name, m in raw["models"].items()
    }
    blobs = {
        sha: BlobEntry(
            sha256=sha,
            size=int(b["size"]),
            added_at=float(b["added_at"]),
            last_used_at=float(b["last_used_at"]),
            last_used=int(b["last_used"]),
        )
        for sha, b in raw["blobs"].items()
    }
    return Index(models=models, blobs=blobs, uses=int(raw["uses"]))
