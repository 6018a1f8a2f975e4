"""The agent's model cache and downloads (issue 10; see docs/models.md).

* ``spec``: ``ModelSpec`` (what the registry says), ``DownloadProgress``, the download lifecycle;
* ``cache``: ``ModelCache``, verified files under a disk budget, LRU eviction, pins;
* ``eviction``: the pure decision of what to delete;
* ``fetch``: one source into a resumable partial file (HTTP Range, or a file);
* ``downloader``: the priority queue, parallel downloads, retries, fallback, progress;
* ``manager``: ``ModelManager``, what the agent holds;
* ``settings``: ``ModelSettings`` and ``DownloadSettings``.
"""

from corral.agent.models.cache import CachedModel, ModelCache
from corral.agent.models.downloader import Downloader
from corral.agent.models.errors import (
    CacheFull,
    DownloadFailed,
    IntegrityError,
    ModelError,
    SourceError,
)
from corral.agent.models.manager import ModelManager
from corral.agent.models.settings import DownloadSettings, ModelSettings
from corral.agent.models.spec import (
    DOWNLOAD,
    DownloadProgress,
    DownloadState,
    ModelKind,
    ModelSpec,
    Priority,
)

__all__ = [
    "DOWNLOAD",
    "CacheFull",
    "CachedModel",
    "DownloadFailed",
    "DownloadProgress",
    "DownloadSettings",
    "DownloadState",
    "Downloader",
    "IntegrityError",
    "ModelCache",
    "ModelError",
    "ModelKind",
    "ModelManager",
    "ModelSettings",
    "ModelSpec",
    "Priority",
    "SourceError",
]
