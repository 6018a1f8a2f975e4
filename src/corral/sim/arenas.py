"""Huge pages for a simulation's objects (the compiled build's ``_arenas``, from ``arenas.c``).

A simulation keeps tens of megabytes of small objects (jobs, runs, allocations, queue
entries) and touches them all over: a job's records are read again when it starts and
when it ends, minutes of simulated time and thousands of other jobs later. On 4 KiB pages
most of those reads first miss the TLB. CPython's small-object allocator takes its memory
an arena (1 MiB) at a time, each by its own ``mmap``, which the kernel backs with huge
pages only where the process asked (transparent huge pages are ``madvise`` on Debian).
``_arenas.enable()`` serves every arena from then on from one region of address space
marked ``MADV_HUGEPAGE``: at 1,000,000 jobs the compiled simulator ran 4-5% faster.

The switch is process-wide and one-way: arenas given back are kept for reuse, not returned
to the system while the process runs. So the simulator's entry points (``corral sim``,
``bench/sim.py``) turn it on; the library's ``simulate`` does not. ``CORRAL_HUGE_PAGES=0``
keeps it off. Pure Python has no ``_arenas`` (``scripts/build-native`` builds it, with
the compiled modules): there this is a no-op that says so.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def use_huge_pages() -> str:
    """Serve this process's small objects from huge pages from now on, where the compiled
    build can; a line saying what was done ("on (...)" or "off (why)")."""
    if os.environ.get("CORRAL_HUGE_PAGES", "").strip() == "0":
        return "off (CORRAL_HUGE_PAGES=0)"
    module = _module()
    if module is None:
        return "off (no corral.sim._arenas: scripts/build-native builds it, for the compiled build)"
    mode = thp_mode()
    if mode == "never":
        return f"off (transparent huge pages are disabled: {THP_SETTING} says never)"
    ok, why = module.enable()
    return f"on ({why})" if ok else f"off (the kernel refused: {why})"


def stats() -> dict[str, Any] | None:
    """The arenas served so far (``_arenas.stats()``), or None without the compiled build."""
    module = _module()
    return None if module is None else dict(module.stats())


def thp_mode(setting: Path = THP_SETTING) -> str | None:
    """The kernel's transparent huge page mode (always, madvise, never), None if unknown
    (``setting``: the file that says it, ``always [madvise] never``)."""
    try:
        text = setting.read_text()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def _module() -> Any:
    try:
        return importlib.import_module("corral.sim._arenas")
    except ImportError:
        return None
