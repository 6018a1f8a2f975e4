"""Benchmark of the simulator: simulated jobs per second, and placement quality.

Usage: ``python bench/sim.py [--nodes 1000] [--jobs 100000 | --full] [--policies a,b,c]``

A generated, seeded trace (``corral.sim.generate``: mostly 1-GPU jobs, a tail
of 2/4/8-GPU jobs and 2x8 gangs, half-card jobs, log-normal run times with
users' estimates of 1-2x, arrivals offering ``--load`` x the cluster on
average with a daily swing so busy hours queue) on ``--nodes`` nodes of 8
GPUs shared by four equal-quota teams, replayed through each policy in turn:
the same trace, the same run. ``--full`` is the goal's size: 1,000,000 jobs
(several minutes per policy; by default only corral's scheduler runs then).
corral's scheduler is kept between cycles (``corral.scheduler.Scheduler``);
``corral-rebuild`` calls ``schedule(snapshot)`` afresh every cycle, the
same plans the slow way. The scheduling loop ticks every
``--cycle-interval`` simulated seconds; the run stops when the last job is
expected to arrive, so the GPU allocation ratio measures a loaded cluster
rather than the drain.

Waits are reported two ways: of the jobs that started (``p95``), and
counting the jobs still queued at the end as waiting until then (``p95 incl.
queued``): a policy that never starts some big jobs must not look better for
it. Prints, per policy::

    simulated jobs/s (1000 nodes, 100000 jobs, corral): N   (per CPU second: C)
    gpu_allocation_ratio (corral): R   wait p50/p95 s: A / B   ...
      p95 wait s by size (corral): 0.5: .. 1: .. 2: .. 4: .. 8: .. 2x8: ..
      p95 wait s incl. queued by size (corral): ...

then the headline (corral's scheduler, or the first policy run) and a table::

    simulated jobs/s (1000 nodes, 100000 jobs): N
    gpu_allocation_ratio corral / first-fit / best-fit: R1 / R2 / R3
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from corral.sim import generate
from corral.sim.policies import POLICIES
from corral.sim.runner import Progress, simulate

DEFAULT_POLICIES = "corral,first-fit,best-fit"


SIZES = ("0.5", "1", "2", "4", "8", "2x8")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.full:
        args.jobs = 1_000_000
        args.policies = args.policies or "corral"
    policies = [p.strip() for p in (args.policies or DEFAULT_POLICIES).split(",") if p.strip()]
    for name in policies:
        if name not in POLICIES:
            print(f"unknown policy {name!r} (known: {', '.join(POLICIES)})", file=sys.stderr)
            return 2
    shape = generate.TraceShape(
        jobs=args.jobs, total_gpus=args.nodes * 8, load=args.load, seed=args.seed
    )
    until = args.until if args.until is not None else _last_arrival(shape)
    print(
        f"trace: {args.nodes} nodes x 8 GPUs, {args.jobs} jobs, load {args.load:g}, "
        f"seed {args.seed}, cycle every {args.cycle_interval:g} s, until {until:,.0f} s",
        flush=True,
    )
    results: dict[str, tuple[float, dict[str, Any]]] = {}
    for name in policies:
        results[name] = _run(name, args, until)
        _print_policy(name, args.nodes, *results[name])
    head = "corral" if "corral" in results else policies[0]
    rate, summary = results[head]
    print(f"simulated jobs/s ({args.nodes} nodes, {summary['jobs_total']} jobs): {rate:,.0f}")
    ratios = " / ".join(f"{results[p][1]['gpu_allocation_ratio']:.4f}" for p in policies)
    print(f"gpu_allocation_ratio {' / '.join(policies)}: {ratios}")
    _print_table(results)
    return 0


def _print_table(results: dict[str, tuple[float, dict[str, Any]]]) -> None:
    """p95 waits by job size, every policy side by side (started only / incl. queued)."""
    print(f"{'p95 wait s':<22}" + "".join(f"{size:>16}" for size in SIZES))
    for name, (_, summary) in results.items():
        by = summary["wait_by_gpus"]
        cells = []
        for size in SIZES:
            entry = by.get(size, {})
            cells.append(f"{_num(entry.get('p95_s'))} / {_num(entry.get('p95_incl_queued_s'))}")
        print(f"{name:<22}" + "".join(f"{c:>16}" for c in cells))
    print("(started jobs only / counting jobs still queued at the end)")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--full", action="store_true", help="1,000,000 jobs (the goal's size)")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cycle-interval", type=float, default=60.0, help="simulated s")
    parser.add_argument("--until", type=float, default=None, help="default: last arrival")
    parser.add_argument("--fragmentation-sample", type=float, default=3600.0, help="simulated s")
    parser.add_argument("--policies", default=None, help=f"default: {DEFAULT_POLICIES}")
    return parser.parse_args(argv)


def _last_arrival(shape: generate.TraceShape) -> float:
    """When the trace's last job arrives (one cheap pass over the stream)."""
    last = 0.0
    for job in generate.trace(shape):
        last = job.submit_at
    return last


def _run(name: str, args: argparse.Namespace, until: float) -> tuple[float, dict[str, Any]]:
    """Simulate the trace through ``name``; return jobs/s of wall time and the summary."""
    scenario = generate.scenario(
        args.nodes,
        args.jobs,
        load=args.load,
        seed=args.seed,
        cycle_interval_s=args.cycle_interval,
        fragmentation_sample_s=args.fragmentation_sample,
    )
    started, cpu = time.perf_counter(), time.process_time()
    summary = simulate(scenario, name, until=until, progress=_progress(name))
    elapsed = time.perf_counter() - started
    summary["cpu_jobs_per_s"] = summary["jobs_total"] / (time.process_time() - cpu)
    return summary["jobs_total"] / elapsed, summary


def _progress(name: str) -> Any:
    def show(p: Progress) -> None:
        if not p.done and p.arrived % 100_000 == 0:
            print(
                f"  {name}: t={p.now:,.0f}s jobs {p.arrived:,} queued {p.queued:,}",
                file=sys.stderr,
                flush=True,
            )

    return show


def _print_policy(name: str, nodes: int, rate: float, summary: dict[str, Any]) -> None:
    frag = summary.get("fragmentation") or {}
    print(
        f"simulated jobs/s ({nodes} nodes, {summary['jobs_total']} jobs, {name}): {rate:,.0f}"
        f"   (per CPU second: {summary['cpu_jobs_per_s']:,.0f})"
    )
    print(
        f"gpu_allocation_ratio ({name}): {summary['gpu_allocation_ratio']:.4f}   "
        f"wait p50/p95 s: {summary['wait_p50_s']} / {summary['wait_p95_s']}   "
        f"preemptions: {summary['preemptions']}   "
        f"fragmentation: {frag.get('score_mean', '-')}   cycles: {summary['cycles']}",
        flush=True,
    )
    by = summary["wait_by_gpus"]
    started = " ".join(f"{k}: {_num(by.get(k, {}).get('p95_s'))}" for k in SIZES)
    queued = " ".join(f"{k}: {_num(by.get(k, {}).get('p95_incl_queued_s'))}" for k in SIZES)
    print(f"  p95 wait s by size ({name}): {started}")
    print(
        f"  p95 wait s incl. queued by size ({name}): {queued}   "
        f"(all jobs: {_num(summary['wait_p95_incl_queued_s'])})",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
