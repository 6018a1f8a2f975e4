"""corral.sim: replay workloads through the pure scheduler with a virtual clock.

``simulate(scenario, policy)`` runs a ``Scenario`` (from ``load_scenario``,
or ``corral.sim.generate``) through a ``schedule``-shaped policy (corral's
scheduler, ``first_fit`` or ``best_fit``) and returns the report's summary;
per-job records go to a sink. See ``docs/sim.md``.
"""

from corral.sim.baselines import best_fit, first_fit
from corral.sim.errors import PlanRejected, SimInputError
from corral.sim.loaders import load_scenario
from corral.sim.policies import POLICIES, resolve
from corral.sim.report import JobRecord, PlacementRecord
from corral.sim.runner import Progress, ScheduleFn, simulate
from corral.sim.scenario import Scenario, SimJob, fixed_jobs

__all__ = [
    "POLICIES",
    "JobRecord",
    "PlacementRecord",
    "PlanRejected",
    "Progress",
    "Scenario",
    "ScheduleFn",
    "SimInputError",
    "SimJob",
    "best_fit",
    "first_fit",
    "fixed_jobs",
    "load_scenario",
    "resolve",
    "simulate",
]
