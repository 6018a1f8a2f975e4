"""``corral sim``: replay a scenario through the scheduler and print a report.

The simulator runs locally (it needs no server): it drives the same pure
``schedule`` function the server calls, with a virtual clock. See
``docs/sim.md`` for the scenario format and the report's fields.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from corral.sim.report import JobRecord
    from corral.sim.runner import Progress

MAX_TABLE_JOBS = 50  # beyond this the table shows only the summary; --json has every job
SPOOL_BYTES = 8 * 1024 * 1024  # job records beyond this spill to a temporary file


def register(app: typer.Typer) -> None:
    """Add ``corral sim`` to the ``corral`` command."""
    app.command("sim")(sim)


def sim(
    scenario: Annotated[
        Path, typer.Argument(help="Scenario (.yaml/.json) or trace (.csv/.jsonl).")
    ],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    until: Annotated[
        float | None, typer.Option(help="Stop at this simulated second.", min=0)
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed passed to the scheduler.")] = None,
    policy: Annotated[
        str, typer.Option(help="corral, first-fit, best-fit or corral-rebuild.")
    ] = "corral",
    cluster: Annotated[
        Path | None, typer.Option(help="Nodes and teams for a .csv/.jsonl trace.")
    ] = None,
    jobs: Annotated[bool, typer.Option(help="Include per-job records in --json.")] = True,
) -> None:
    """Replay SCENARIO with a virtual clock and report waits, utilisation and fairness."""
    from corral.core.errors import CorralError
    from corral.sim.arenas import use_huge_pages
    from corral.sim.errors import PlanRejected
    from corral.sim.loaders import load_scenario
    from corral.sim.policies import resolve
    from corral.sim.runner import simulate

    err = Console(stderr=True)
    use_huge_pages()  # the compiled build's objects on huge pages; pure Python: nothing to do
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES, mode="w+", encoding="utf-8") as spool:
        collected: list[JobRecord] = []
        sink = _spooler(spool) if json_out and jobs else _collector(collected)
        try:
            loaded = load_scenario(scenario, cluster=cluster)
            resolve(policy)  # an unknown name is bad input, named, before anything runs
            with _progress(err) as show:
                summary = simulate(loaded, policy, until=until, seed=seed, sink=sink, progress=show)
        except PlanRejected as exc:
            err.print(
                f"[red]error:[/] the {policy} scheduler made a plan that cannot be applied: {exc}"
            )
            raise typer.Exit(3) from None
        except CorralError as exc:
            err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)  # pools[g]: text
            raise typer.Exit(2) from None
        head = {
            "scenario": loaded.name,
            "policy": policy,
            "seed": loaded.seed if seed is None else seed,
        }
        if json_out:
            _print_json({**head, "summary": summary}, spool if jobs else None, sys.stdout)
        else:
            _print_tables(head, summary, collected)


def _spooler(spool: IO[str]) -> Any:
    first = [True]

    def write(record: JobRecord) -> None:
        spool.write(("" if first[0] else ",\n") + json.dumps(record.as_dict()))
        first[0] = False

    return write


def _collector(collected: list[JobRecord]) -> Any:
    def keep(record: JobRecord) -> None:
        if len(collected) <= MAX_TABLE_JOBS:
            collected.append(record)

    return keep


def _print_json(head: dict[str, Any], spool: IO[str] | None, out: IO[str]) -> None:
    """``{..., "summary": {...}, "jobs": [...]}`` with the jobs copied from the spool."""
    text = json.dumps(head, indent=2)
    if spool is None:
        out.write(text + "\n")
        return
    out.write(text[:-2] + ',\n  "jobs": [\n')
    spool.seek(0)
    shutil.copyfileobj(spool, out)
    out.write("\n  ]\n}\n")


class _progress:
    """Progress on stderr: a live line on a terminal, a line per update otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Any = None

    def __enter__(self) -> Any:
        if self.console.is_terminal:
            from rich.progress import Progress as Bar
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

            self.live = Bar(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.live.start()
            self.task = self.live.add_task("simulating")
        return self.show

    def show(self, p: Progress) -> None:
        text = (
            f"t={p.now:,.0f}s  jobs {p.arrived:,}  queued {p.queued:,}  "
            f"running {p.running:,}  cycles {p.cycles:,}"
        )
        if self.live is not None:
            self.live.update(self.task, description=text)
        elif not p.done:
            self.console.print(f"sim: {text}", highlight=False)

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()


def _print_tables(head: dict[str, Any], summary: dict[str, Any], jobs: list[JobRecord]) -> None:
    out = Console()
    table = Table(title=f"corral sim: {head['scenario']} ({head['policy']}, seed {head['seed']})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if not isinstance(value, dict):
            table.add_row(key, _fmt(value))
    out.print(table)
    for key in ("wait_by_priority", "wait_by_team"):
        groups = summary[key]
        if not groups:
            continue
        waits = Table(title=key.replace("_", " "))
        for column in ("name", "jobs", "p50 s", "p95 s", "mean s"):
            waits.add_column(column, justify="left" if column == "name" else "right")
        for name, stats in groups.items():
            waits.add_row(name, *(_fmt(stats[k]) for k in ("jobs", "p50_s", "p95_s", "mean_s")))
        out.print(waits)
    if summary.get("autoscaler"):
        _print_autoscaler(out, summary["autoscaler"])
    if len(jobs) > MAX_TABLE_JOBS:
        out.print(f"{summary['jobs_total']:,} jobs: use --json for each job's placements")
        return
    _print_jobs(out, jobs)


def _print_autoscaler(out: Console, scaled: dict[str, Any]) -> None:
    """One line of totals and a row per pool: node-hours and what they cost."""
    out.print(
        f"autoscaler: {scaled['launched']} launched, {scaled['removed']} removed, "
        f"{scaled['nodes_at_end']} at the end, at most {scaled['peak_nodes']} at once, "
        f"{scaled['decisions']} decisions, cost {_fmt(scaled['cost'])}",
        highlight=False,
    )
    table = Table(title="autoscaled pools")
    table.add_column("pool")
    table.add_column("node-hours", justify="right")
    for pool, hours in scaled["node_hours"].items():
        table.add_row(pool, _fmt(hours))
    out.print(table)


def _print_jobs(out: Console, jobs: list[JobRecord]) -> None:
    table = Table(title="jobs")
    for column in ("id", "state", "team", "priority", "wait s", "placements"):
        table.add_column(column)
    for job in sorted(jobs, key=lambda j: (j.submit_at, j.id)):
        where = ", ".join(
            f"{p.node}×{p.gpus:g} {p.start:g}–{'' if p.end is None else f'{p.end:g}'}"
            + (" preempted" if p.preempted else "")
            for p in job.placements
        )
        table.add_row(job.id, job.state.value, job.team, job.priority, _fmt(job.wait_s), where)
    out.print(table)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)
