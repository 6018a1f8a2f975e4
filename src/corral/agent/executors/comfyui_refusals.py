"""Why ComfyUI would not run a graph, as a job's failure.

* ``refusal``: a 400 from ``/prompt``: ComfyUI's message and, node by node, its reasons;
* ``dropped``: a 200 with ``node_errors``: ComfyUI would run only the other outputs;
* ``lacks``: either one, when its only reasons are model files this backend does not
  have: then the failure is retryable (another node may have them) and names the files
  (``model_names.lacking``), so the server sends the job elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.agent.executors.base import Failed
from corral.core.comfyui import describe
from corral.core.model_names import comfyui_lacks, lacking


def refusal(error: Mapping[str, Any], node_errors: object) -> str:
    """A 400 from ``/prompt``: ComfyUI's message and, node by node, its reasons."""
    reasons = describe(node_errors) if isinstance(node_errors, Mapping) else ""
    details = reasons or str(error.get("details") or "")
    message = str(error.get("message") or error.get("type") or "invalid prompt")
    return f"comfyui refused the prompt: {message}" + (f": {details}" if details else "")


def lacks(backend: str, node_errors: object, reason: str) -> Failed | None:
    """A refusal only for model files this backend lacks: another node may have them, so
    the job may run there (``lacking`` names them for the server and the agent's re-listing)."""
    missing = comfyui_lacks(node_errors) if isinstance(node_errors, Mapping) else ()
    return Failed(lacking(backend, missing, reason), retryable=True) if missing else None


def dropped(node_errors: Mapping[str, Any]) -> str:
    """A 200 with ``node_errors``: which outputs ComfyUI dropped, and why."""
    outputs = sorted(
        {
            str(o)
            for e in node_errors.values()
            if isinstance(e, Mapping)
            for o in e.get("dependent_outputs") or []
        },
        key=lambda k: (len(k), k),
    )
    which = ", ".join(f"#{o}" for o in outputs) or "some"
    return (
        f"comfyui dropped output nodes {which} of the prompt (they failed validation; "
        f"corral runs a graph whole or not at all): {describe(node_errors)}"
    )
