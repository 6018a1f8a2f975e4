"""Resumable sampling on ComfyUI: a sampler split into segments, a latent saved after each.

ComfyUI samples a whole ``KSampler`` in one call, so a machine lost at step 45
of 50 loses all 45. corral rewrites each sampler it can split into a chain of
``KSamplerAdvanced`` nodes over consecutive step ranges, as ComfyUI's own
split-sampling workflows do: the first adds the noise, every later one starts
from its predecessor's latent without adding any (``add_noise: disable``), every
one but the last keeps its leftover noise (``return_with_leftover_noise:
enable``), and the last denoises as the original did. Each segment's latent goes
to a ``SaveLatent``; the executor turns each saved latent into a corral
checkpoint. A resumed attempt loads the checkpoint's latent (``LoadLatent``) in
place of the segments before it, so only the remaining steps run.

A split run is the unsplit run exactly only for samplers whose every step depends
on nothing but the latent and its noise level (``SPLIT_EXACT``): multistep ones
(``dpmpp_2m``, ``lms``, ``uni_pc``) remember earlier steps and ancestral or SDE ones
draw fresh noise from a generator a new segment restarts. Those, a ``KSampler``
with ``denoise`` below 1, a sampler whose settings are links, and samplers corral
does not know (``SamplerCustom``...) run unsegmented, with a note saying so.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

SPLIT_EXACT = frozenset({"euler", "heun", "dpm_2", "ddim"})
"""Samplers whose steps are memoryless and noise-free (ComfyUI's ``k_diffusion``)."""
SPLITTABLE = ("KSampler", "KSamplerAdvanced")
PREFIX = "corral-"  # the ids of the nodes corral adds


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a sampler continues: its node, the step its latent holds, the latent's
    reference on the backend (as ``LoadLatent`` names it)."""

    node: str
    step: int
    latent: str


@dataclass(frozen=True, slots=True)
class Range:
    """A segment node's place in its sampler's run."""

    sampler: str
    start: int
    total: int


@dataclass
class Segmented:
    """The rewritten graph and what its added nodes mean."""

    graph: dict[str, Any]
    segments: dict[str, Range] = field(default_factory=dict)  # sampler node id -> range
    latents: dict[str, Range] = field(default_factory=dict)  # SaveLatent id -> (start: step)
    notes: list[str] = field(default_factory=list)
    resumed: Resume | None = None


def segment(graph: dict[str, Any], every: int, job: str, resume: Resume | None) -> Segmented:
    """``graph`` with its splittable samplers split every ``every`` steps (see the module doc);
    ``resume`` (when its sampler is still splittable) replaces the steps before it."""
    out = Segmented(copy.deepcopy(graph))
    saves: dict[str, Any] = {}
    for node_id, node in graph.items():
        kind = str(node.get("class_type", "")) if isinstance(node, dict) else ""
        if kind not in SPLITTABLE:
            if "Sampler" in kind:
                out.notes.append(f"node {node_id} ({kind}) runs unsegmented: {_UNKNOWN}")
            continue
        plan = _plan(str(node_id), node)
        if isinstance(plan, str):
            out.notes.append(f"node {node_id} ({kind}) runs unsegmented: {plan}")
            continue
        here = resume if resume is not None and resume.node == node_id else None
        if here is not None and not plan.start < here.step < plan.end:
            here = None
        _split(out, saves, str(node_id), plan, every, job, here)
        out.resumed = here or out.resumed
    # saves first: ComfyUI (and the reference) run ready output nodes first, in order,
    # so each latent is saved as soon as its segment is done
    out.graph = {**saves, **out.graph}
    return out


_UNKNOWN = "corral cannot split a sampler it does not know"


@dataclass(frozen=True, slots=True)
class _Plan:
    inputs: dict[str, Any]  # as KSamplerAdvanced's
    start: int
    end: int
    leftover: str


def _plan(node_id: str, node: dict[str, Any]) -> _Plan | str:
    """The sampler as one ``KSamplerAdvanced`` run, or why it cannot be split."""
    inputs = dict(node.get("inputs") or {})
    if node["class_type"] == "KSampler":
        if _number(inputs.get("denoise", 1.0)) < 0.9999:
            return "a denoise below 1 runs part of a longer schedule"
        inputs["noise_seed"] = inputs.pop("seed", None)
        inputs.pop("denoise", None)
        inputs.update(
            add_noise="enable",
            start_at_step=0,
            end_at_step=10000,
            return_with_leftover_noise="disable",
        )
    if inputs.get("sampler_name") not in SPLIT_EXACT:
        return f"sampler {inputs.get('sampler_name')!r} does not give the same image split"
    fields = ("steps", "start_at_step", "end_at_step", "noise_seed")
    if not all(isinstance(inputs.get(k), int) for k in fields):
        return "its steps or seed come from another node"
    steps = int(inputs["steps"])
    start, end = int(inputs["start_at_step"]), min(int(inputs["end_at_step"]), steps)
    if start >= end:
        return "it runs no steps"
    return _Plan(inputs, start, end, str(inputs.get("return_with_leftover_noise")))


def _split(
    out: Segmented,
    saves: dict[str, Any],
    node_id: str,
    plan: _Plan,
    every: int,
    job: str,
    resume: Resume | None,
) -> None:
    first = resume.step if resume is not None else plan.start
    bounds = [*range(first, plan.end, max(1, every)), plan.end]
    latent: Any = plan.inputs["latent_image"]
    noise = plan.inputs["add_noise"]
    if resume is not None:
        load = f"{PREFIX}{node_id}-load"
        out.graph[load] = {"class_type": "LoadLatent", "inputs": {"latent": resume.latent}}
        latent, noise = [load, 0], "disable"
    total = int(plan.inputs["steps"])
    for a, b in itertools.pairwise(bounds):
        last = b == plan.end
        seg = node_id if last else f"{PREFIX}{node_id}-{a}"
        inputs = {
            **plan.inputs,
            "add_noise": noise,
            "start_at_step": a,
            "end_at_step": plan.inputs["end_at_step"] if last else b,
            "latent_image": latent,
            "return_with_leftover_noise": plan.leftover if last else "enable",
        }
        out.graph[seg] = {"class_type": "KSamplerAdvanced", "inputs": inputs}
        out.segments[seg] = Range(node_id, a, total)
        if not last:
            save = f"{PREFIX}{node_id}-save-{b}"
            prefix = f"corral/{job}-{node_id}-{b}"
            saves[save] = {
                "class_type": "SaveLatent",
                "inputs": {"samples": [seg, 0], "filename_prefix": prefix},
            }
            out.latents[save] = Range(node_id, b, total)
        latent, noise = [seg, 0], "disable"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
