"""Settings of the model cache and its downloads, built once by the agent and passed down.

Every bad value raises ``InvalidSpec`` naming the setting (``models.parallel``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from corral.core import InvalidSpec, parse_bytes

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DownloadSettings:
    parallel: int = 2  # downloads at once: a few saturate a home link; more only split it
    chunk_bytes: int = 16 * MIB  # bytes per Range request: small enough to resume cheaply
    retries: int = 4  # tries of one source after failures that made no progress
    backoff_s: float = 1.0  # first retry delay; doubles per failure
    backoff_max_s: float = 60.0
    jitter: float = 0.2  # +-fraction of each delay, so agents do not retry in step
    progress_step: float = 0.01  # publish at least every 1% ...
    progress_interval_s: float = 1.0  # ... or every second of clock time, whichever first
    preempt_prefetch: bool = True  # pause a running prefetch for a job's download

    def __post_init__(self) -> None:
        for name in ("parallel", "chunk_bytes"):
            if getattr(self, name) < 1:
                raise InvalidSpec(
                    f"models.{name}", f"must be at least 1, got {getattr(self, name)}"
                )
        for name in ("retries", "backoff_s", "backoff_max_s", "progress_interval_s"):
            if getattr(self, name) < 0:
                raise InvalidSpec(
                    f"models.{name}", f"must not be negative, got {getattr(self, name)}"
                )
        if not 0 <= self.jitter < 1:
            raise InvalidSpec("models.jitter", f"must be in [0, 1), got {self.jitter}")


@dataclass(frozen=True, slots=True)
class ModelSettings:
    dir: Path
    budget_bytes: int
    downloads: DownloadSettings = field(default_factory=DownloadSettings)
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0  # a server silent this long is dropped and retried
    touch_flush_s: float = 30.0  # how stale the LRU order on disk may get after a crash

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise InvalidSpec("models.budget_bytes", f"must be positive, got {self.budget_bytes}")

    @classmethod
    def parse(
        cls, directory: str | Path, budget: str | int, downloads: DownloadSettings | None = None
    ) -> ModelSettings:
        """Settings from CLI-style values: ``ModelSettings.parse("~/.corral/models", "50GiB")``."""
        size = parse_bytes(budget, field_name="models.budget")
        return cls(Path(directory).expanduser(), size, downloads or DownloadSettings())
