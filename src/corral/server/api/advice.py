"""What a user can do about a job no node can ever run, said in a sentence.

The scheduler's remedy ``none`` means no node, however idle, could run the job as it
was asked: waiting is pointless. A new user meets this first as a GPU job on a machine
without a GPU, where the job would otherwise wait for ever in silence; so the queue
names the cause and the command that fixes it.
"""

from __future__ import annotations

from corral.scheduler.api import ReasonCode, Remedy, Unplaced

FAKE_GPUS = 'start an agent with --fake-gpus "1x RTX 4090 24GiB" to try'
_NO_GPU = "fewer than 1 usable GPU"  # explain.py's words when one GPU is asked: none has any

ADVICE = {  # by the reason that ruled out the most nodes
    ReasonCode.TOO_FEW_GPUS: "no node has that many GPUs: add one that has, or "
    + FAKE_GPUS
    + ", or ask for fewer (resources.gpus)",
    ReasonCode.GPU_MODEL_MISMATCH: "no node has that GPU model: add one, or drop "
    "resources.gpu_models",
    ReasonCode.SELECTOR_MISMATCH: "no node has those labels: start an agent with "
    "--label key=value, or change node_selector",
    ReasonCode.BACKEND_MISSING: "no node serves that backend: start an agent with it "
    "(--a1111 URL, --comfyui URL), or change backend",
    ReasonCode.INSUFFICIENT_VRAM: "no GPU has that much VRAM: ask for less (resources.vram)",
}


def advice(u: Unplaced | None) -> str | None:
    """What to do about a job no node can ever run; None when it only has to wait."""
    if u is None or u.remedy is not Remedy.NONE:
        return None
    if not u.reasons or u.reasons[0].message == "no nodes in the cluster":
        return "no node has joined: start an agent (corral agent), or " + FAKE_GPUS
    first = u.reasons[0]
    if first.code is ReasonCode.TOO_FEW_GPUS and first.message.startswith(_NO_GPU):
        return f"no node has a GPU: {FAKE_GPUS}, or ask for none (resources.gpus: 0)"
    return ADVICE.get(first.code, "no node can ever run it as it is: change its request")
