"""Benchmark: model-aware routing against routing that ignores models, in one run.

Usage: ``python bench/models.py [--jobs 3000] [--nodes 16] [--models 20] [--load 0.7]``

A seeded workload (``corral.sim.model_world``): many users submit image jobs
(exponential compute times, mean 12 s), each naming one of 20 models of 2-7 GB
with Zipf popularity (the k-th model ~ 1/k^1.1), Poisson arrivals at
``--load`` x what 16 one-GPU nodes compute. Each GPU holds one model; each
node caches four models' worth on disk (least recently used evicted) and
downloads at 200 MB/s; loading from disk runs at 1 GB/s. The same pure
scheduler decides in three modes:

* ``model-aware``: models on nodes, registry sizes and rates known: locality
  scoring, waiting for a busy node with the model when quicker, prefetching
  popular models onto idle nodes;
* ``locality only``: nodes report their models; no waiting, no prefetch;
* ``model-blind``: routing ignores models.

Prints per mode, then the headline::

    swaps per job (model-aware / locality only / model-blind): A / B / C
    wait p95 s (model-aware / locality only / model-blind): A / B / C

A swap is a job that started on a GPU without its model loaded (a load from
disk, maybe after a download); wait is submission to the start of computing
(queueing plus the swap).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from corral.sim.model_world import MODES, ModelWorkload, run

LABELS = {"aware": "model-aware", "locality": "locality only", "blind": "model-blind"}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    w = ModelWorkload(
        jobs=args.jobs,
        users=args.users,
        models=args.models,
        nodes=args.nodes,
        load=args.load,
        seed=args.seed,
    )
    print(
        f"workload: {w.nodes} nodes x 1 GPU, {w.models} models ({w.size_gb[0]:g}-"
        f"{w.size_gb[1]:g} GB, zipf {w.zipf_s:g}), {w.jobs} jobs from {w.users} users, "
        f"load {w.load:g}, fetch {w.fetch_bytes_per_s / 1e6:g} MB/s, load "
        f"{w.load_bytes_per_s / 1e9:g} GB/s, disk cache {w.cache_models:g} models/node",
        flush=True,
    )
    summaries = {}
    for mode in MODES:
        started = time.process_time()
        s = run(w, mode).summary()
        summaries[mode] = s
        print(
            f"{LABELS[mode]}: swaps/job {s['swaps_per_job']:.3f}, downloads/job "
            f"{s['downloads_per_job']:.3f}, prefetches {s['prefetches']:.0f}, wait p50/p95 s "
            f"{s['wait_p50_s']:.1f} / {s['wait_p95_s']:.1f}, GPU time loading "
            f"{100 * s['startup_share']:.0f}%, makespan {s['makespan_s']:.0f} s "
            f"({time.process_time() - started:.1f} CPU s)",
            flush=True,
        )
    order = " / ".join(LABELS[m] for m in MODES)
    for key, label, fmt in (
        ("swaps_per_job", "swaps per job", "{:.3f}"),
        ("downloads_per_job", "downloads per job", "{:.3f}"),
        ("wait_p50_s", "wait p50 s", "{:.1f}"),
        ("wait_p95_s", "wait p95 s", "{:.1f}"),
    ):
        values = " / ".join(fmt.format(summaries[m][key]) for m in MODES)
        print(f"{label} ({order}): {values}")
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--users", type=int, default=60)
    p.add_argument("--models", type=int, default=20)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--load", type=float, default=0.7, help="arrivals / compute capacity")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
