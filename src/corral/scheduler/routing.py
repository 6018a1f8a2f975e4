"""Model-aware routing: start now where the model must be fetched, or wait for a node that has it?

The scorers already prefer, among the nodes where a job fits *now*, one
whose backend has the job's model loaded, then one with it on disk. This
module answers the question they cannot: when every node with room lacks
the model, is it quicker to fetch it there, or to wait for a busy node that
has it?

    cost now     = start-up time on the chosen node
                   (loaded: 0; on disk: size / load rate; absent: size / fetch rate + load)
    cost waiting = when the holder's work should end (``Snapshot.expected_ends``)
                   + start-up time on the holder (0 when loaded there)

The job waits (left queued with reason ``model_wait``) only when waiting is
expected to be quicker, the holder's end is known, and the job has not been
queued for ``Config.model_max_wait_s`` yet (so an estimate that keeps being
wrong cannot hold a job for ever). A job that waits *books* the holder for
its own run time, so the next job of the same model sees the queue behind
the holder grow and, once waiting is no longer worth it, goes to fetch the
model elsewhere: popular models spread over more nodes by themselves.

A job may name further models (``Job.models``: LoRAs, a VAE ...); the nodes
that lack any of them are passed over while one that has them all fits
(``without``), and a holder that lacks them is not worth waiting for. A node
whose backend refused the job for a model it lacks (``Job.lacking_nodes``) is
never used for it again (``Cycle.find``'s ``exclude``; ``on_lacking`` catches
the paths that do not search: gangs, backfills, evictions).

Waiting is off unless ``Config.model_fetch_bytes_per_s`` is set and the snapshot gives
``model_sizes``. Pure: it reads the cycle's working copy, decides, and
returns a value; the planner applies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from corral.core.model import Job
from corral.scheduler.api import Config, Reason, ReasonCode, Remedy
from corral.scheduler.cycle import Cycle, locality
from corral.scheduler.fit import Fit, fit_on
from corral.scheduler.need import Need
from corral.scheduler.node_cap import LOADED, ON_DISK, NodeCap


@dataclass(frozen=True, slots=True)
class Wait:
    """Leave the job queued: node ``holder`` should be the quicker way to start it."""

    holder: int  # node index in the cycle
    until: float  # the holder is booked until then (its end + this job's run time)
    reasons: tuple[Reason, ...]
    remedy: Remedy = Remedy.WAIT


def startup_s(where: int, size: int, config: Config) -> float:
    """Seconds before a job can start computing on a node with this locality of its model."""
    if where == LOADED:
        return 0.0
    load = size / config.model_load_bytes_per_s
    if where == ON_DISK or config.model_fetch_bytes_per_s is None:
        return load
    return size / config.model_fetch_bytes_per_s + load


class ModelRouter:
    """Per cycle: which nodes hold which model, and the wait-or-fetch decision."""

    def __init__(self, cycle: Cycle, config: Config, sizes: Mapping[str, int]) -> None:
        self.cycle = cycle
        self.config = config
        self.sizes = sizes
        self._holders: dict[str, list[NodeCap]] | None = None
        self._without: dict[frozenset[str], frozenset[str]] = {}

    @property
    def enabled(self) -> bool:
        return self.config.model_fetch_bytes_per_s is not None and bool(self.sizes)

    def consider(self, job: Job, need: Need, fit: Fit, now: float) -> Wait | None:
        """A ``Wait`` when a busy node with the model should start ``job`` sooner than ``fit``."""
        model = job.model
        size = self.sizes.get(model) if model else None
        if model is None or not size or job.gang:
            return None
        here = locality(fit.node, model)
        cost_now = startup_s(here, size, self.config)
        if cost_now <= 0 or now - job.submitted_at >= self.config.model_max_wait_s:
            return None
        best: tuple[float, float, NodeCap] | None = None
        for nc in self._holders_of(model):
            where = locality(nc, model)
            end = self.cycle.expected_end(nc.idx)
            if where <= here or end is None or not self._could_run(nc, need):
                continue
            if nc.name in job.lacking_nodes or nc.name in self.without(job.models):
                continue
            wait = max(0.0, end - now) + startup_s(where, size, self.config)
            if best is None or wait < best[0]:
                best = (wait, end, nc)
        if best is None:
            return None
        wait, end, nc = best
        if wait >= cost_now or now - job.submitted_at + wait > self.config.model_max_wait_s:
            return None
        until = max(end, now) + (job.estimated_runtime_s or 0.0)
        return Wait(nc.idx, until, (self._reason(model, nc, wait, cost_now),))

    def without(self, models: frozenset[str]) -> frozenset[str]:
        """The nodes that lack one of ``models`` (on disk or loaded), once per cycle and set."""
        if not models:
            return frozenset()
        found = self._without.get(models)
        if found is None:
            found = frozenset(
                nc.name
                for nc in self.cycle.cap.nodes
                if not models <= (nc.node.models_on_disk | nc.node.models_loaded)
            )
            self._without[models] = found
        return found

    def book(self, wait: Wait) -> None:
        """The holder is spoken for: the next job of this model queues behind this one."""
        self.cycle.book(wait.holder, wait.until)

    def _could_run(self, nc: NodeCap, need: Need) -> bool:
        """A holder the job could run on once it frees up (not one where it fits now: then
        the scorers preferred another node on purpose)."""
        if nc.hidden or not nc.schedulable or self.cycle.checks.reason(need, nc.cls) is not None:
            return False
        return fit_on(nc, need) is None

    def _holders_of(self, model: str) -> list[NodeCap]:
        if self._holders is None:
            self._holders = {}
            for nc in self.cycle.cap.nodes:
                node = nc.node
                for m in node.models_loaded | node.models_on_disk:
                    if m in self.sizes:
                        self._holders.setdefault(m, []).append(nc)
        return self._holders.get(model, [])

    @staticmethod
    def _reason(model: str, nc: NodeCap, wait: float, cost_now: float) -> Reason:
        text = (
            f"waiting for {nc.name}, which has model {model}: expected to start in "
            f"~{wait:.0f}s there, against ~{cost_now:.0f}s to fetch and load it elsewhere"
        )
        return Reason(ReasonCode.MODEL_WAIT, 1, text)


def on_lacking(job: Job, fits: list[Fit]) -> bool:
    """Is one of ``fits`` on a node that refused ``job`` for a model it lacks?"""
    return any(f.node.name in job.lacking_nodes for f in fits)


def lacking_reason(job: Job) -> Reason:
    """Why the nodes that refused ``job`` for a model they lack are not tried again."""
    names = sorted(job.lacking_nodes)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    text = f"lack a model it needs (their backends said so): {shown}"
    return Reason(ReasonCode.MODEL_MISSING, len(names), text)
