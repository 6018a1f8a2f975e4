"""Tables and short human forms (ages, sizes, GPU summaries) for the client commands.

Pure: models in, ``rich`` renderables or strings out. ``now`` is an argument,
so ages are testable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from corral.sdk import AutoscalerStatus, JobStatus, NodeStatus, QueueEntry, TeamQuota, WaitInfo

STATE_STYLE = {
    "waiting": "grey62",  # for the jobs it runs after (a pipeline step)
    "queued": "yellow",
    "placed": "cyan",
    "running": "blue",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "interrupted": "dark_orange",  # stopped early on request: a partial result, or none
    "ready": "green",
    "paused": "yellow",
    "draining": "yellow",
    "lost": "red",
}
GIB = 2**30


# Columns each table leaves out, first to last, until it fits a narrow terminal: what
# identifies a row (its id, name, state, age) stays; the details go first.
JOBS_DROP = ("PRIORITY", "KIND", "USER", "PROGRESS", "NODE", "TEAM", "NEEDS")
QUEUE_DROP = ("USER", "PRIORITY", "TEAM", "WAITING", "NEEDS")
NODES_DROP = ("MODELS", "CPUS", "JOBS", "UTIL", "LAST SEEN", "VRAM")
POOLS_DROP = ("CAP/H", "BACKOFF", "PROVIDER", "MIN", "COST/H")
MODELS_DROP = ("BACKEND", "KIND", "SIZE")
AUDIT_DROP = ("FROM", "TARGET", "DETAIL")


def fit(table: Table, console: Console, drop: Sequence[str]) -> Table:
    """``table`` without the columns named in ``drop``, left out in that order only while
    it is wider than ``console``: folding every cell to a few letters reads worse than
    fewer columns (``--json`` has them all)."""
    unbounded = console.options.update_width(10_000)  # its natural width, not the screen's
    for name in drop:
        if console.measure(table, options=unbounded).maximum <= console.width:
            break
        table.columns = [c for c in table.columns if c.header != name]
    return table


def styled(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{escape(state)}[/]"


def age(then: float | None, now: float) -> str:
    """``"4s"``, ``"12m"``, ``"3h"``, ``"2d"``; ``"-"`` for never."""
    if not then:
        return "-"
    seconds = max(0.0, now - then)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def gib(n: int) -> str:
    return f"{n / GIB:.0f}" if n % GIB == 0 else f"{n / GIB:.1f}"


def eta(j: JobStatus, now: float) -> str:
    """``"starts in ~4 min"`` for a queued job, ``"ends in ~2 min"`` for a running one
    (the server's estimate: docs/scheduler.md, "ETA"); ``""`` without one."""
    if j.eta is None or j.done:
        return ""
    return j.eta.describe(now, running=j.state.value != "queued")


def jobs_table(jobs: list[JobStatus], now: float) -> Table:
    table = Table(box=None, pad_edge=False)
    names = ("ID", "STATE", "KIND", "TEAM", "USER", "PRIORITY", "NEEDS", "NODE", "PROGRESS", "ETA")
    for name in names:
        table.add_column(name, no_wrap=name in ("ID", "STATE"))
    table.add_column("AGE", justify="right")
    for j in jobs:
        table.add_row(
            j.id,
            styled(j.outcome),
            j.kind,
            escape(j.team),
            escape(j.user),
            j.priority,
            escape(j.resources.describe()),
            escape(j.node or "-"),
            f"{j.progress:.0%}" if j.state.value == "running" else "",
            eta(j, now),
            age(j.submitted_at, now),
        )
    return table


def why(info: WaitInfo | None) -> str:
    """The scheduler's reason a job waits, in one line."""
    if info is None:
        return ""
    text = info.summary or "; ".join(f"{r.nodes} nodes: {r.message}" for r in info.reasons)
    if info.remedy and info.remedy != "none":
        text += f" (could run after: {info.remedy})"
    if info.advice:
        text += f" — {info.advice}"
    return text


def queue_table(entries: list[QueueEntry], now: float) -> Table:
    table = Table(box=None, pad_edge=False)
    for name in ("#", "ID", "TEAM", "USER", "PRIORITY", "NEEDS", "WAITING", "ETA", "WHY"):
        table.add_column(name, no_wrap=name in ("#", "ID"), overflow="fold")
    for e in entries:
        j = e.job
        table.add_row(
            str(e.position + 1),
            j.id,
            escape(j.team),
            escape(j.user),
            j.priority,
            escape(j.resources.describe()),
            age(j.submitted_at, now),
            eta(j, now),
            escape(why(e.queue)),
        )
    return table


def gpus_summary(node: NodeStatus) -> str:
    """``"2× RTX 4090"`` (mixed models listed each), ``"-"`` without GPUs."""
    counts = Counter(g.model for g in node.gpus)
    return ", ".join(f"{n}× {escape(model)}" for model, n in counts.items()) or "-"


def vram_summary(node: NodeStatus) -> str:
    """``"12/48 GiB"`` used of total when the agent measures free VRAM, else the total."""
    total = sum(g.vram_bytes for g in node.gpus)
    if not total:
        return "-"
    free = [g.vram_free_bytes for g in node.gpus]
    if any(f is None for f in free):
        return f"{gib(total)} GiB"
    used = total - sum(f or 0 for f in free)
    return f"{gib(used)}/{gib(total)} GiB"


def utilization(node: NodeStatus) -> str:
    values = [g.utilization for g in node.gpus if g.utilization is not None]
    return f"{sum(values) / len(values):.0%}" if values else "-"


def models_summary(node: NodeStatus) -> str:
    """Loaded models in bold, then the others on disk."""
    loaded = [f"[bold]{escape(m)}[/]" for m in node.models_loaded]
    disk = [escape(m) for m in node.models_on_disk if m not in node.models_loaded]
    return ", ".join(loaded + disk) or "-"


def nodes_table(nodes: list[NodeStatus], now: float) -> Table:
    table = Table(box=None, pad_edge=False)
    for name in ("NAME", "STATE", "GPUS", "VRAM", "UTIL", "CPUS", "MEMORY", "MODELS", "JOBS"):
        table.add_column(name, no_wrap=name in ("NAME", "STATE"))
    table.add_column("LAST SEEN", justify="right")
    for n in nodes:
        table.add_row(
            escape(n.name),
            styled(n.condition),
            gpus_summary(n),
            vram_summary(n),
            utilization(n),
            f"{n.cpus:g}",
            f"{n.memory_bytes / GIB:.0f}GiB" if n.memory_bytes else "-",
            models_summary(n),
            str(sum(len(a.job_ids) for a in n.allocations)),
            age(n.last_seen, now) + " ago",
        )
    return table


def pools_table(status: AutoscalerStatus, now: float) -> Table:
    """One row per pool: its provider and machine, its bounds, its price and spend cap, and
    any back-off (its machines by state are ``pool_machines``)."""
    table = Table(box=None, pad_edge=False)
    for name in ("POOL", "PROVIDER", "MACHINE", "MIN", "MAX", "COST/H", "CAP/H", "BACKOFF"):
        table.add_column(name, no_wrap=True)
    for p in status.pools:
        machine = f"{p.gpus}x {p.gpu_model} {p.vram_bytes / GIB:g}GiB" if p.gpus else "CPU"
        backoff = f"{p.backoff_until - now:.0f}s" if p.backoff_until else "-"
        cap = "-" if p.max_spend_per_hour is None else f"{p.max_spend_per_hour:g}"
        table.add_row(
            escape(p.name),
            escape(p.provider or "-") + (" (fixed)" if p.fixed else ""),
            escape(f"{machine}, {p.cpus} CPUs"),
            str(p.min_nodes),
            str(p.max_nodes),
            f"{p.cost_per_hour:g}",
            cap,
            backoff,
        )
    return table


def pool_machines(status: AutoscalerStatus) -> list[str]:
    """Per pool: its machines launching, joined and draining, and what they cost now."""
    lines = []
    for p in status.pools:
        counts = ", ".join(
            f"{p.machines.get(s, 0)} {s}" for s in ("launching", "joined", "draining")
        )
        lost = "".join(f", {p.machines[s]} {s}" for s in ("lost", "terminating") if s in p.machines)
        lines.append(f"{escape(p.name)}: {counts}{lost}; {p.cost_per_hour_now:g}/h now")
    return lines


def teams_table(teams: list[TeamQuota]) -> Table:
    table = Table(box=None, pad_edge=False)
    for name in ("TEAM", "QUOTA GPUS", "BORROW LIMIT", "WEIGHT"):
        table.add_column(name, no_wrap=True)
    for t in teams:
        limit = "any idle" if t.borrow_limit_gpus is None else f"{t.borrow_limit_gpus:g}"
        table.add_row(escape(t.name), f"{t.quota_gpus:g}", limit, f"{t.weight:g}")
    return table


def job_details(j: JobStatus, now: float) -> Table:
    """Two columns, field and value, for ``corral job ID``."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    rows: list[tuple[str, str]] = [
        ("id", j.id),
        ("state", styled(j.outcome) + (f" ({j.state.value})" * j.interrupted)),
        ("kind", j.kind),
        ("team / user", f"{escape(j.team)} / {escape(j.user)}"),
        ("priority", j.priority + ("" if j.preemptible else " (not preemptible)")),
        ("needs", escape(j.resources.describe()) + (f", {j.replicas} replicas" * (j.replicas > 1))),
        ("submitted", age(j.submitted_at, now) + " ago"),
        (
            "attempt",
            f"{j.attempt} of {j.max_attempts}" + (f", {j.failures} failed" * bool(j.failures)),
        ),
    ]
    optional = [
        ("model", j.model and escape(j.model)),
        ("ran", j.ran and escape(", ".join(f"{k}={v}" for k, v in sorted(j.ran.items())))),
        ("node", j.node and escape(j.node)),
        ("started", j.started_at and age(j.started_at, now) + " ago"),
        ("finished", j.finished_at and age(j.finished_at, now) + " ago"),
        ("progress", f"{j.progress:.0%}" if j.state.value == "running" else None),
        ("eta", eta(j, now)),
        ("checkpoint", j.checkpoint and escape(j.checkpoint)),
        ("error", j.error and f"[red]{escape(j.error)}[/]"),
        ("waiting because", escape(why(j.queue)) if j.queue else None),
    ]
    rows += [(k, str(v)) for k, v in optional if v]
    rows += [(f"result {escape(f.name)}", f"{f.size} bytes, {f.content_type}") for f in j.result]
    for key, value in rows:
        grid.add_row(key, value)
    return grid
