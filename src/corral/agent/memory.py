"""The host memory an agent offers to jobs' memory requests.

Allocatable memory is the machine's RAM (or its container's cgroup limit, when lower)
less a reserve for the operating system, the agent and page cache, as Kubernetes' node
allocatable is capacity less system-reserved and the eviction threshold. The reserve is
5 % of RAM and at least 1 GiB unless the agent is told otherwise (``--memory-reserve``);
``--memory`` states the allocatable amount outright (a ``--fake-gpus`` test machine, or
a machine shared with other work).

This is accounting, not enforcement: the scheduler places no more requested memory on a
node than it offers, and the agent tells a command job its request
(``CORRAL_MEMORY_BYTES``), but sets no limit on the process. RLIMIT_AS would break CUDA
(it maps far more address space than it uses), RLIMIT_RSS is not enforced by Linux, and
a cgroup needs privileges or a delegated hierarchy the agent cannot assume.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Final

from corral.core.errors import InvalidSpec
from corral.core.resources import GIB, memory_text

log = logging.getLogger("corral.agent")

MIN_RESERVE: Final = GIB
RESERVE_SHARE: Final = 0.05
CGROUP_LIMITS: Final = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def physical_memory() -> int:
    """The machine's RAM in bytes; 0 when the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def cgroup_limit(paths: tuple[Path, ...] = CGROUP_LIMITS) -> int | None:
    """The memory limit of the agent's container (cgroup v2 or v1), None when unlimited."""
    for path in paths:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def host_memory() -> int:
    """What the agent may hand out before its reserve: RAM, or a lower container limit."""
    total = physical_memory()
    limit = cgroup_limit()
    return min(total, limit) if limit is not None and total else total


def default_reserve(total: int) -> int:
    """5 % of ``total``, at least 1 GiB."""
    return max(MIN_RESERVE, int(total * RESERVE_SHARE))


def allocatable(total: int, reserve: int | None = None) -> int:
    """``total`` less ``reserve`` (default: ``default_reserve``), never below 0."""
    held = default_reserve(total) if reserve is None else reserve
    if held >= total > 0:
        log.warning(
            "the memory reserve (%s) is all of this machine's %s: jobs asking for memory "
            "will not run here; give --memory-reserve or --memory",
            memory_text(held),
            memory_text(total),
        )
    return max(0, total - held)


def offered(memory: int | None, reserve: int | None) -> int:
    """The memory an agent reports: ``memory`` when given (``--memory``), else the host's
    allocatable; refuses both given, which would mean two different amounts."""
    if memory is not None and reserve is not None:
        raise InvalidSpec("--memory-reserve", "give --memory or --memory-reserve, not both")
    if memory is not None:
        return memory
    return allocatable(host_memory(), reserve)
