"""A job whose node's backend lacks a model it names: try another node, or say none has it.

The agent reports such a failure retryably, naming the models
(``model_names.lacking``: ComfyUI's ``value_not_in_list`` for a ``ckpt_name``,
``lora_name`` or ``vae_name``; a checkpoint or LoRA the webui does not list).
The node is not at fault, so:

* the job goes back to the queue at once (no backoff: nothing will change on
  the node it failed on) and the scheduler never sends it to that node again
  (``Job.lacking_nodes``, read from the attempt history);
* ``max_attempts`` and the same-failure rule do not end it: every such failure
  rules out one more node, so the nodes bound the attempts; it fails, naming the
  models and the nodes, once every node that offers its backend has said it lacks
  them (a node that is away counts as one that may have them: it may come back);
* the node's failure streak does not grow (``node_health``): lacking a LoRA is
  not a broken machine.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.events import EventKind
from corral.core.states import JobState
from corral.server.services.outcomes import Settlement
from corral.server.services.unit import Tx
from corral.server.store import nodes as node_repo
from corral.server.store.records import JobRecord, lacking_nodes

SHOWN_NODES = 5
"""Nodes named in the final error; the rest are counted."""


async def settle_lacking(
    tx: Tx, job: JobRecord, node: str, models: Sequence[str], error: str
) -> Settlement:
    """Requeue ``job`` (another node may have ``models``), or fail it when none can."""
    refused = lacking_nodes(job.attempt_errors) | {node}
    backend = job.job.backend
    offering = [
        r.node.name
        for r in await node_repo.all_nodes(tx.conn)
        if backend is None or backend in r.node.backends
    ]
    if any(name not in refused for name in offering):
        return Settlement(JobState.QUEUED, EventKind.JOB_REQUEUED, error=error, count_failure=True)
    return Settlement(
        JobState.FAILED,
        EventKind.JOB_FAILED,
        error=nowhere(models, sorted(refused), backend),
        count_failure=True,
    )


def nowhere(models: Sequence[str], nodes: Sequence[str], backend: str | None) -> str:
    """The final error: which models, and that every node said it lacks them."""
    shown = ", ".join(nodes[:SHOWN_NODES])
    if len(nodes) > SHOWN_NODES:
        shown += f" and {len(nodes) - SHOWN_NODES} more"
    which = ", ".join(models)
    offers = f" with the {backend} backend" if backend else ""
    return f"no node has model {which}: every node{offers} said it lacks it ({shown})"
