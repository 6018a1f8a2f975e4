"""Data-parallel training with torch.distributed (DDP), one rank per corral gang replica.

Run as a gang (two machines, each running ``corral agent --command "python train.py"``)::

    corral submit examples/ddp/gang.yaml --watch --out weights/

corral gives each replica ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (``init_process_group`` reads them), the gang's last
checkpoint in ``CORRAL_RESUME_FROM`` when an attempt resumes, and a folder for
results in ``CORRAL_OUTPUT_DIR``. Rank 0 alone writes checkpoints (every rank
holds the same weights under DDP); every rank resumes from the one it wrote.
Stopped (SIGTERM) or left alone by a lost peer, rank 0 saves where it got to
before it exits.

The run is deterministic for a seed: each step's batch is drawn from
``(seed, step)`` and split between the ranks, so a run that was stopped and
resumed from a checkpoint ends with exactly the weights of one that was not.
The gloo backend runs on CPUs; on GPUs, pass ``--backend nccl``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    args = parse()
    torch.set_num_threads(1)  # the ranks share the machine's cores; a fixed order of sums
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} joined", flush=True)
    note(args.ledger, "join", rank)
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = resume(model, opt)
    ddp = DistributedDataParallel(model)
    stopping: list[int] = []  # corral stops a replica with SIGTERM (preempted, or a peer lost)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    for step in range(start + 1, args.steps + 1):
        x, y = batch(args.seed, step, args.batch)
        opt.zero_grad()
        try:
            loss = torch.nn.functional.mse_loss(ddp(x[rank::world]), y[rank::world])
            loss.backward()  # DDP averages the gradients over the ranks: the whole batch's
        except RuntimeError:  # a peer went away mid-step: the weights are still step - 1's
            leave(rank, model, opt, step - 1, start)
        opt.step()
        if stopping:
            leave(rank, model, opt, step, start)
        if rank == 0:
            note(args.ledger, "step", step)
            print(f"CORRAL_PROGRESS {step}/{args.steps} loss {loss.item():.5f}", flush=True)
            if step % args.checkpoint_every == 0 and step < args.steps:
                save(model, opt, step)
        time.sleep(args.step_s)
    if rank == 0:
        weights = [v for p in model.parameters() for v in p.detach().flatten().tolist()]
        out = Path(os.environ.get("CORRAL_OUTPUT_DIR", "."))
        summary = {"steps": args.steps, "resumed_from": start, "weights": weights}
        (out / "weights.json").write_text(json.dumps(summary))
    dist.destroy_process_group()


def leave(
    rank: int, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, start: int
) -> None:
    """Stop early: rank 0 saves where the gang got to, so the next attempt loses nothing;
    exit 75 ("try again"), as the gang is retried."""
    if rank == 0 and step > start:
        save(model, opt, step)
    raise SystemExit(75)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=48, help="the whole batch, split over ranks")
    p.add_argument("--step-s", type=float, default=0.0, help="pause after each step (demos)")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--ledger", default="", help="append ranks' joins and steps here (a file)")
    return p.parse_args()


def batch(seed: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch: the same on every rank and in every attempt."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, 16, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def resume(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Load the gang's last checkpoint, if this attempt has one; the step it holds."""
    path = os.environ.get("CORRAL_RESUME_FROM")
    if not path:
        return 0
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"])


def save(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """A new file per checkpoint: the agent uploads it while training goes on."""
    folder = Path(os.environ.get("CORRAL_CHECKPOINT_DIR") or ".")
    path = folder / f"step-{step}.pt"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path)
    print(f"CORRAL_CHECKPOINT {path} {step}", flush=True)


def note(ledger: str, what: str, n: int) -> None:
    """``<what> <attempt> <n> <time>``: ranks joining and steps done, for bench/gang.py."""
    if ledger:
        with open(ledger, "a") as f:
            f.write(f"{what} {os.environ.get('CORRAL_ATTEMPT', '0')} {n} {time.time():.4f}\n")


if __name__ == "__main__":
    main()
