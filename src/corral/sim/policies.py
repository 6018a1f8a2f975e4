"""The placement policies a simulation can run, by name.

``corral`` is the real scheduler (``corral.scheduler.schedule``); the others
are the baselines of ``corral.sim.baselines``. All have the same shape.
"""

from __future__ import annotations

import importlib
from typing import cast

from corral.sim.baselines import best_fit, first_fit
from corral.sim.errors import SimInputError
from corral.sim.runner import ScheduleFn

POLICIES = ("corral", "first-fit", "best-fit")


def resolve(name: str) -> ScheduleFn:
    """The ``schedule`` function called ``name``."""
    if name == "first-fit":
        return first_fit
    if name == "best-fit":
        return best_fit
    if name == "corral":
        return corral_schedule()
    raise SimInputError("policy", f"unknown policy {name!r} (known: {', '.join(POLICIES)})")


def corral_schedule() -> ScheduleFn:
    """``corral.scheduler.schedule``, looked up at run time so a build without it says so."""
    module = importlib.import_module("corral.scheduler")
    schedule = getattr(module, "schedule", None)
    if schedule is None:
        raise SimInputError("policy", "corral.scheduler.schedule is not available in this build")
    return cast(ScheduleFn, schedule)
