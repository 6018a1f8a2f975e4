"""A job's failed attempts: what each one said, and when failing again is pointless (pure).

Every attempt that ends badly (the agent reported an error, or its node was
lost) is remembered with its node and error. Two uses:

* a job that fails **the same way on several nodes** is not the nodes'
  fault: after ``same_failure_nodes`` distinct nodes it fails for good
  instead of using up every attempt (or looping, for jobs with many);
* the final error lists **every attempt's** error, so the user sees the
  history ("attempt 1 on n1: CUDA out of memory; attempt 2 on n2: ...").

"The same way" compares errors with numbers and hex ids masked, so
"out of memory at step 12" and "... at step 40" count as one failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from corral.server.store.records import AttemptError

_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-f]{8,}\b|\d+(\.\d+)?")
MAX_ERROR = 500  # characters of one attempt's error kept in the history
MAX_SUMMARY = 4000  # characters of the final error that lists every attempt


def signature(error: str) -> str:
    """The error with its numbers and ids masked: what "the same way" compares."""
    return _NUMBERS.sub("#", error.strip().lower())


def nodes_failing_alike(history: Iterable[AttemptError], error: str, node: str | None) -> int:
    """Distinct nodes (this one included) on which an attempt failed with ``error``'s signature."""
    wanted = signature(error)
    nodes = {h.node for h in history if h.node and signature(h.error) == wanted}
    if node:
        nodes.add(node)
    return len(nodes)


def remember(history: Sequence[AttemptError], entry: AttemptError) -> list[AttemptError]:
    """``history`` plus ``entry`` (its error cut to ``MAX_ERROR``), oldest first."""
    kept = AttemptError(entry.attempt, entry.node, entry.error[:MAX_ERROR], entry.at)
    return [*history, kept]


def summary(history: Sequence[AttemptError]) -> str:
    """Every attempt's error on one line, cut to ``MAX_SUMMARY``."""
    parts = [f"attempt {h.attempt}{f' on {h.node}' if h.node else ''}: {h.error}" for h in history]
    text = "; ".join(parts)
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 3] + "..."
