"""What can go wrong with models, as part of corral's one exception tree.

::

    CorralError
    └── ModelError                 base: something about one model (``model`` names it)
        ├── IntegrityError         a file's sha256 is not the registry's (both hashes named)
        ├── CacheFull              the budget cannot be met: what is left is pinned in use
        ├── DownloadFailed         every source failed; ``errors`` says why, per source
        └── SourceError            one source failed once (``transient``: another try may work)

``DownloadFailed`` and ``CacheFull`` are what a job waiting for a model sees;
the agent turns them into a retryable ``Failed`` so the server can place the
job elsewhere.
"""

from __future__ import annotations

from corral.core import CorralError


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``: sizes in messages people read."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


class ModelError(CorralError):
    """A problem with one model; ``model`` is its registry name."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(message)
        self.model = model


class IntegrityError(ModelError):
    """A file whose content is not what the registry says. The file was deleted."""

    def __init__(self, model: str, expected: str, actual: str, where: str) -> None:
        super().__init__(
            model,
            f"model {model}: sha256 mismatch from {where}: expected {expected}, got {actual} "
            "(file deleted)",
        )
        self.expected = expected
        self.actual = actual
        self.where = where


class CacheFull(ModelError):
    """No room for a model: the cache budget is taken by models in use (pinned)."""

    def __init__(self, model: str, need: int, budget: int, pinned: dict[str, int]) -> None:
        if need > budget:
            why = f"it is larger than the whole cache budget ({human_bytes(budget)})"
        else:
            held = ", ".join(
                f"{name} ({human_bytes(size)})" for name, size in sorted(pinned.items())
            )
            why = (
                f"the budget is {human_bytes(budget)} and what cannot be evicted is in use "
                f"or being downloaded: {held or 'nothing evictable'}"
            )
        super().__init__(model, f"no room for model {model} ({human_bytes(need)}): {why}")
        self.need = need
        self.budget = budget
        self.pinned = dict(pinned)


class SourceError(ModelError):
    """One try at one source failed. ``transient``: the same source may work if retried."""

    def __init__(
        self,
        model: str,
        source: str,
        message: str,
        *,
        transient: bool,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(model, f"{source}: {message}")
        self.source = source
        self.transient = transient
        self.retry_after = retry_after  # seconds the server asked us to wait (Retry-After)


class DownloadFailed(ModelError):
    """Every source of a model failed. ``errors`` holds the last error of each source."""

    def __init__(self, model: str, errors: list[ModelError]) -> None:
        lines = "; ".join(str(e) for e in errors) or "no source tried"
        super().__init__(model, f"model {model} could not be downloaded: {lines}")
        self.errors = list(errors)
