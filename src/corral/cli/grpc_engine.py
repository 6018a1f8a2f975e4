"""gRPC's I/O engine for the processes the ``corral`` command runs, chosen before gRPC loads.

grpcio 1.85 runs client channels and listeners on its EventEngine by default. On
corral's agent link (one long-lived bidirectional stream per agent, small messages, each
one's latency on a job's critical path) gRPC's polling engine is faster. Measured with
both settings in turn in one run: a bare bidirectional ping-pong with 2 ms pauses,
0.27-0.42 ms per round trip against 0.22-0.27 ms; ``bench/agent_link.py``'s idle shape
with pauses, 1.76-1.91 against 1.43-1.77 ms and 20-28% less of the agents' CPU;
``bench/e2e.py``'s idle shape (two corral peers in turn), 4.1 -> 3.5, 4.7 -> 3.9 and 3.3
-> 2.5 ms (p50) with 14-23% less CPU in the server and the agents together.

So the command sets ``GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener``
when it is imported, before anything imports gRPC (gRPC reads the variable
once, as it loads). ``GRPC_EXPERIMENTS`` set already is kept as it is (it is
gRPC's own setting); ``CORRAL_GRPC_ENGINE=event_engine`` keeps gRPC's default.
A process that embeds the server or the agent without the command gets
gRPC's default unless it sets the variable itself.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Final

from corral.core.errors import InvalidSpec

ENV: Final = "CORRAL_GRPC_ENGINE"
CHOICES: Final = ("poller", "event_engine")
POLLER_EXPERIMENTS: Final = "-event_engine_client,-event_engine_listener"


def choose(environ: MutableMapping[str, str] = os.environ) -> str:
    """Apply ``CORRAL_GRPC_ENGINE`` (default ``poller``) to ``environ``; the engine chosen.

    Raises ``InvalidSpec`` naming the variable for any other value.
    """
    wanted = environ.get(ENV, "").strip().lower() or "poller"
    if wanted not in CHOICES:
        raise InvalidSpec(ENV, f"must be {' or '.join(CHOICES)}, not {wanted!r}")
    if wanted == "poller":
        environ.setdefault("GRPC_EXPERIMENTS", POLLER_EXPERIMENTS)
    # corral's processes fork only to exec (the autoscaler's provider command, the agent's
    # command executor), never to use gRPC in the child: without this, gRPC's fork handlers
    # log "skipping fork() handlers" on every subprocess while its threads are busy.
    environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    return wanted
