"""Prometheus metrics, one registry per server instance (never the global one).

Two servers in one process (tests) therefore never share counters.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from corral.core.model import Job, Node

_LATENCY_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._queue_seen: Tally[tuple[str, str]] | None = None  # what the gauges show now
        self._nodes_seen: Tally[str] | None = None
        r = self.registry
        self.submitted = Counter(
            "corral_jobs_submitted", "Jobs accepted", ["priority", "team"], registry=r
        )
        self.finished = Counter("corral_jobs_finished", "Jobs that ended", ["state"], registry=r)
        self.placements = Counter("corral_placements", "Allocations created", registry=r)
        self.preemptions = Counter("corral_preemptions", "Allocations preempted", registry=r)
        self.consolidations = Counter(
            "corral_consolidation_moves",
            "Allocations stopped to run again elsewhere so that a waiting job fits",
            registry=r,
        )
        self.requeues = Counter("corral_requeues", "Jobs requeued", ["why"], registry=r)
        # Usage as allocations end (services/usage.py): GPU-seconds (a shared card's share
        # counts its fraction), CPU-seconds and cost at the node pool's price.
        usage = ["team", "priority"]
        self.usage_gpu_seconds = Counter(
            "corral_usage_gpu_seconds", "GPU-seconds used by ended allocations", usage, registry=r
        )
        self.usage_cpu_seconds = Counter(
            "corral_usage_cpu_seconds", "CPU-seconds used by ended allocations", usage, registry=r
        )
        self.usage_cost = Counter(
            "corral_usage_cost", "Cost of ended allocations' GPU time", usage, registry=r
        )
        self.retention_deleted = Counter(
            "corral_retention_deleted",
            "What the retention sweep deleted: jobs, events, result files, previews, audit records",
            ["what"],
            registry=r,
        )
        self.autoscaler_members = Gauge(
            "corral_autoscaler_members",
            "Machines the autoscaler's provider runs, by pool and state",
            ["pool", "state"],
            registry=r,
        )
        self.autoscaler_launched = Counter(
            "corral_autoscaler_launched", "Machines the autoscaler launched", ["pool"], registry=r
        )
        self.autoscaler_removed = Counter(
            "corral_autoscaler_removed", "Machines the autoscaler removed", ["pool"], registry=r
        )
        self.autoscaler_not_joined = Counter(
            "corral_autoscaler_not_joined",
            "Machines removed because their agent did not join within boot_timeout_s",
            ["pool"],
            registry=r,
        )
        self.autoscaler_cost = Gauge(
            "corral_autoscaler_cost_per_hour",
            "What the autoscaler's machines (running and launching) cost per hour now, by pool",
            ["pool"],
            registry=r,
        )
        self.autoscaler_errors = Counter(
            "corral_autoscaler_errors",
            "Provider calls that failed (list, launch, terminate)",
            ["call"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "corral_queue_depth", "Queued jobs", ["priority", "team"], registry=r
        )
        self.nodes = Gauge("corral_nodes", "Nodes by state", ["state"], registry=r)
        self.wait_seconds = Histogram(
            "corral_job_wait_seconds", "Submit to start", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.run_seconds = Histogram(
            "corral_job_run_seconds", "Start to end", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.cycle_seconds = Histogram(
            "corral_schedule_cycle_seconds", "One scheduling cycle", registry=r
        )
        self.event_streams = Gauge(
            "corral_event_streams",
            "Open SSE event streams (/v1/events, a job's events)",
            registry=r,
        )
        self.leader = Gauge(
            "corral_scheduling_leader", "1 while this replica runs the scheduling loop", registry=r
        )

    def observe_queue(self, queued: Iterable[Job]) -> None:
        """Replace the queue-depth gauges with the counts in ``queued`` (every cycle: the
        gauges are rewritten only when a count changed)."""
        counts = Tally((j.priority, j.team) for j in queued)
        if counts == self._queue_seen:
            return
        self._queue_seen = counts
        self.queue_depth.clear()
        for (priority, team), n in counts.items():
            self.queue_depth.labels(priority, team).set(n)

    def observe_nodes(self, nodes: Iterable[Node]) -> None:
        counts = Tally(_node_state(n) for n in nodes)
        if counts == self._nodes_seen:
            return
        self._nodes_seen = counts
        for state in ("ready", "paused", "draining", "lost"):
            self.nodes.labels(state).set(counts.get(state, 0))

    def observe_members(self, counts: dict[tuple[str, str], int]) -> None:
        """Replace the autoscaler's member gauges with ``counts`` by (pool, state)."""
        self.autoscaler_members.clear()
        for (pool, state), n in counts.items():
            self.autoscaler_members.labels(pool, state).set(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _node_state(node: Node) -> str:
    if node.state.value != "ready":
        return node.state.value
    if node.draining:
        return "draining"
    return "paused" if node.paused else "ready"
