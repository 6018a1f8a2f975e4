"""The AUTOMATIC1111 ``/sdapi/v1`` API on a whole cluster: requests become jobs.

``txt2img``/``img2img``/``extra-single-image`` submit a job (backend ``a1111``,
payload: the request body plus ``mode``) and answer when it ends, in the
webui's own shape (``images`` base64, ``parameters``, ``info`` as a JSON
string taken from the backend that ran it). While it waits, the request's
events feed a ``Tracker`` that ``/progress`` reads: only the caller's own
request, with its latest preview.

Options are per caller (token + user name), never global: a checkpoint chosen
through ``POST /options`` becomes the ``model`` of that caller's later jobs
(so the scheduler routes them to nodes with it), other options travel as the
request's ``override_settings``.

Over 400 lines on purpose: every webui route a client calls is here in the webui's shapes;
split by route, the per-caller options and the progress tracker they share would scatter.
"""

from __future__ import annotations

import base64
import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.core.errors import InvalidSpec
from corral.core.events import Event, EventKind
from corral.core.states import JobState
from corral.server.services.compat import (
    Caller,
    CompatJobs,
    Disconnected,
    Submission,
    Unservable,
)
from corral.server.services.compat_catalog import (
    Catalog,
    CatalogCache,
    find_model,
    model_entries,
)
from corral.server.store.records import JobRecord

BACKEND = "a1111"
RESPONSE_FILE = "response.json"  # the backend's answer without its images (the agent's)
_STEP = re.compile(r"step (\d+)/(\d+)")
_IMAGE = re.compile(r"^image-(\d+)\.\w+$")
JOB_NAMES = {"txt2img": "scripts_txt2img", "img2img": "scripts_img2img", "upscale": "extras"}


class GenerationFailed(Exception):
    """The job failed: answered like the webui's exception middleware (500)."""


@dataclass
class Tracker:
    """One running request as ``/progress`` shows it, fed by its job's events."""

    job_id: str
    job: str  # the webui's state.job name
    submitted_at: float
    started_at: float | None = None
    fraction: float = 0.0
    step: int = 0
    steps: int = 0
    preview_url: str | None = None
    interrupted: bool = False

    async def see(self, event: Event) -> None:
        if event.kind is EventKind.JOB_STARTED:
            self.started_at = event.at
        elif event.kind is EventKind.JOB_PROGRESS:
            self.fraction = max(self.fraction, float(event.data.get("progress", 0.0)))
            match = _STEP.search(str(event.data.get("message", "")))
            if match:
                self.step, self.steps = int(match.group(1)), int(match.group(2))
        elif event.kind is EventKind.JOB_PREVIEW:
            self.preview_url = str(event.data.get("url", "")) or self.preview_url


@dataclass
class _CallerState:
    options: dict[str, Any] = field(default_factory=dict)
    model: str | None = None  # the checkpoint's name for routing (job.model)
    running: list[Tracker] = field(default_factory=list)
    used_at: float = 0.0


class CallerStates:
    """Per-caller state, bounded: kept for the ``max_callers`` callers used last, each
    forgotten once unused for ``idle_s``, but never while one of its requests runs."""

    def __init__(self, max_callers: int, idle_s: float) -> None:
        self.max_callers = max_callers
        self.idle_s = idle_s
        self._kept: OrderedDict[tuple[str, str], _CallerState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: tuple[str, str], now: float) -> _CallerState:
        """``key``'s state (a new one if forgotten or never seen), marked used at ``now``."""
        state = self._kept.pop(key, None) or _CallerState()
        state.used_at = now
        self._kept[key] = state  # the most recently used come last
        self._forget(now)
        return state

    def _forget(self, now: float) -> None:
        """Forget the oldest callers while there are too many or they are idle."""
        doomed: list[tuple[str, str]] = []
        for key, state in self._kept.items():
            over = len(self._kept) - len(doomed) > self.max_callers
            if not over and now - state.used_at < self.idle_s:
                break  # the rest were used later
            if not state.running:
                doomed.append(key)
        for key in doomed:
            del self._kept[key]


class A1111Service:
    def __init__(self, jobs: CompatJobs, catalogs: CatalogCache) -> None:
        self.jobs = jobs
        self.catalogs = catalogs
        settings = jobs.settings
        self._callers = CallerStates(settings.max_callers, settings.caller_idle_s)
        self._default_entry: Mapping[str, Any] | None = None

    def _default(self, catalog: Catalog | None) -> str | None:
        """The checkpoint of callers who chose none: what the backend had loaded when first
        asked, kept, so one caller's choice never changes what the others get."""
        if self._default_entry is None and catalog is not None:
            title = str((catalog.data.get("options") or {}).get("sd_model_checkpoint") or "")
            self._default_entry = find_model(title, catalog.entries("sd-models")) if title else None
        entry = self._default_entry
        return str(entry.get("model_name") or entry.get("title")) if entry else None

    def _state(self, caller: Caller) -> _CallerState:
        return self._callers.get(caller.key, self.jobs.plane.rt.clock.now())

    # ---- generation ----------------------------------------------------------

    async def generate(
        self,
        caller: Caller,
        mode: str,
        body: dict[str, Any],
        *,
        priority: str | None = None,
        disconnected: Disconnected | None = None,
    ) -> tuple[dict[str, Any], JobRecord]:
        """Run one webui request as a job; the webui's answer and the job."""
        payload, model = await self._payload(caller, mode, body)
        sub = Submission(BACKEND, payload, model=model, priority=priority)
        rec, _ = await self.jobs.submit(caller, sub)
        now = self.jobs.plane.rt.clock.now()
        tracker = Tracker(rec.job.id, JOB_NAMES[mode], now)
        state = self._state(caller)
        state.running.append(tracker)
        try:
            done = await self.jobs.wait(caller, rec.job.id, tracker.see, disconnected)
        finally:
            state.running.remove(tracker)
        return await self._answer(caller, done, mode, body), done

    async def _payload(
        self, caller: Caller, mode: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], str | None]:
        """The job's payload and model: the request with this caller's sticky options."""
        nodes = await self.jobs.backend_nodes(caller, BACKEND)
        if mode == "upscale":
            return {**body, "mode": mode}, None
        state = self._state(caller)
        overrides = body.get("override_settings") or {}
        if not isinstance(overrides, dict):
            raise InvalidSpec("override_settings", "must be an object of option: value")
        overrides = dict(overrides)
        wanted = overrides.pop("sd_model_checkpoint", None)
        catalog = await self._catalog(caller)
        self._check_sampler(body, catalog)
        model = state.model or self._default(catalog)
        if wanted:
            model = _resolve_model(str(wanted), nodes, catalog)
        payload = {**body, "mode": mode}
        sticky = {k: v for k, v in state.options.items() if k != "sd_model_checkpoint"}
        merged = {**sticky, **overrides}
        if merged:
            payload["override_settings"] = merged
        elif "override_settings" in payload:
            payload["override_settings"] = {}
        return payload, model

    async def _catalog(self, caller: Caller) -> Catalog | None:
        """The backend's lists if they can be had (validation is best effort)."""
        try:
            return await self.catalogs.get(caller, BACKEND)
        except Unservable:
            raise
        except Exception:  # a slow catalog must not block generation
            return None

    @staticmethod
    def _check_sampler(body: Mapping[str, Any], catalog: Catalog | None) -> None:
        name = body.get("sampler_name") or body.get("sampler_index")
        if not name or catalog is None or not catalog.entries("samplers"):
            return
        known = set()
        for s in catalog.entries("samplers"):
            known |= {str(s.get("name"))} | {str(a) for a in s.get("aliases") or []}
        if str(name) not in known:
            raise Unservable(
                f"Sampler not found: {name!r} (the backends have: {', '.join(sorted(known))})",
                status=404,
            )

    async def _answer(
        self, caller: Caller, done: JobRecord, mode: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        if done.state is JobState.FAILED:
            raise GenerationFailed(f"corral job {done.job.id} failed: {done.error}")
        files = await self.jobs.files(caller, done) if done.state is JobState.SUCCEEDED else {}
        images = sorted(
            ((int(m.group(1)), data) for name, data in files.items() if (m := _IMAGE.match(name))),
        )
        encoded = [base64.b64encode(data).decode() for _, data in images]
        backend: dict[str, Any] = {}
        if RESPONSE_FILE in files:
            try:
                backend = json.loads(files[RESPONSE_FILE])
            except ValueError:
                backend = {}
        if mode == "upscale":
            html = backend.get("html_info", "")
            return {"html_info": html, "image": encoded[0] if encoded else ""}
        ran = done.ran or {}
        info = _ran_info(backend.get("info"), body, ran)
        return {"images": encoded, "parameters": _ran_parameters(body, ran), "info": info}

    # ---- progress, interrupt, skip -------------------------------------------

    async def progress(self, caller: Caller, skip_image: bool) -> dict[str, Any]:
        """``/progress`` of the caller's own request (the running one, else the oldest)."""
        running = self._state(caller).running
        if not running:
            return idle_progress()
        tracker = next((t for t in running if t.started_at is not None), running[0])
        image = None
        if tracker.preview_url and not skip_image:
            data = await self.jobs.preview(caller, tracker.job_id, tracker.preview_url)
            image = base64.b64encode(data).decode()
        return progress_body(tracker, len(running), self.jobs.plane.rt.clock.now(), image)

    async def interrupt(self, caller: Caller) -> None:
        """Stop the caller's requests; each answers with what it made so far."""
        for tracker in list(self._state(caller).running):
            tracker.interrupted = True
            await self.jobs.interrupt(caller, tracker.job_id)

    async def skip(self, caller: Caller) -> None:
        """Skip the image being made: one request is one job, so its running job ends early."""
        running = [t for t in self._state(caller).running if t.started_at is not None]
        for tracker in running[:1]:
            await self.jobs.interrupt(caller, tracker.job_id)

    # ---- options and lists ---------------------------------------------------

    async def options(self, caller: Caller) -> dict[str, Any]:
        """The backend's options as this caller sees them (its own choices on top)."""
        catalog = await self.catalogs.get(caller, BACKEND)
        state = self._state(caller)
        base = dict(catalog.data.get("options") or {})
        self._default(catalog)
        if self._default_entry is not None:
            base["sd_model_checkpoint"] = self._default_entry.get("title")
        return {**base, **state.options}

    async def set_options(self, caller: Caller, body: Mapping[str, Any]) -> None:
        """Remember options for this caller only; a checkpoint must exist on some node.

        Options the backends do not have are refused (when their list can be had), and
        so are options that would take more than ``compat.options_max_bytes`` kept."""
        await self._check_options(caller, body)
        state = self._state(caller)
        changes = dict(body)
        wanted = changes.pop("sd_model_checkpoint", None)
        if wanted is not None:
            nodes = await self.jobs.backend_nodes(caller, BACKEND)
            catalog = await self._catalog(caller)
            name = _resolve_model(str(wanted), nodes, catalog)
            entry = find_model(name, model_entries(catalog, nodes))
            state.model = name
            state.options["sd_model_checkpoint"] = str(entry["title"]) if entry else str(wanted)
        state.options.update(changes)

    async def _check_options(self, caller: Caller, body: Mapping[str, Any]) -> None:
        try:
            catalog = await self.catalogs.get(caller, BACKEND)
        except Exception:  # no backend to ask (or it is slow): the size cap still holds
            catalog = None
        known = catalog.data.get("options") if catalog is not None else None
        if isinstance(known, dict) and known:
            for key in body:
                if key not in known:
                    raise InvalidSpec(key, f"not an option of the {BACKEND} backends")
        cap = self.jobs.settings.options_max_bytes
        kept = {**self._state(caller).options, **body}
        size = len(json.dumps(kept, default=str))
        if size > cap:
            raise InvalidSpec(
                "body",
                f"this caller's options would take {size} bytes, over the limit of {cap} "
                "(compat.options_max_bytes)",
            )

    async def listing(self, caller: Caller, name: str) -> list[Any]:
        """``sd-models`` (every node's), ``samplers``, ``upscalers``, ``loras`` (the backend's)."""
        catalog = await self.catalogs.get(caller, BACKEND)
        if name == "sd-models":
            nodes = await self.jobs.backend_nodes(caller, BACKEND)
            return model_entries(catalog, nodes)
        return catalog.entries(name)


def _resolve_model(wanted: str, nodes: list[Any], catalog: Catalog | None) -> str:
    """The name a job should carry for ``wanted``; ``Unservable`` when no node has it."""
    entries = model_entries(catalog, nodes)
    entry = find_model(wanted, entries)
    if entry is not None:
        return str(entry.get("model_name") or entry.get("title") or wanted)
    if not entries:
        return wanted  # nothing is known about the backends' models: let the node decide
    have = ", ".join(sorted(str(e.get("model_name") or e.get("title")) for e in entries))
    raise Unservable(
        f"model {wanted!r} not found: no node has model {wanted!r} "
        f"(the {BACKEND} backends have: {have})",
        status=404,
    )


def idle_progress() -> dict[str, Any]:
    """What the webui answers when nothing runs."""
    state = {
        "skipped": False,
        "interrupted": False,
        "stopping_generation": False,
        "job": "",
        "job_count": 0,
        "job_timestamp": "0",
        "job_no": 0,
        "sampling_step": 0,
        "sampling_steps": 0,
    }
    return {
        "progress": 0,
        "eta_relative": 0,
        "state": state,
        "current_image": None,
        "textinfo": None,
        "current_task": None,
    }


def progress_body(t: Tracker, count: int, now: float, image: str | None) -> dict[str, Any]:
    """``/progress`` for one tracked request (pure: ``now`` is an input)."""
    body = idle_progress()
    started = t.started_at is not None
    progress = min(1.0, max(0.01, t.fraction)) if started else 0.0
    elapsed = now - (t.started_at or t.submitted_at)
    eta = elapsed / progress - elapsed if progress > 0 else 0.0
    body["state"].update(
        job=t.job if started else "",
        job_count=count,
        job_timestamp=_stamp(t.started_at or t.submitted_at),
        interrupted=t.interrupted,
        sampling_step=t.step,
        sampling_steps=t.steps,
    )
    body.update(
        progress=progress,
        eta_relative=max(0.0, eta),
        current_image=image,
        textinfo=None if started else "Waiting in the corral queue...",
        current_task=t.job_id,
    )
    return body


def _stamp(at: float) -> str:
    import time

    return time.strftime("%Y%m%d%H%M%S", time.gmtime(at))


def _info_from(body: Mapping[str, Any]) -> dict[str, Any]:
    """An ``info`` built from the request, when the agent sent none (an older agent)."""
    keys = ("prompt", "negative_prompt", "seed", "steps", "width", "height", "sampler_name")
    return {k: body[k] for k in keys if k in body}


# What ran (the job's ``ran``, from the agent) under the names the webui's ``info`` uses.
_INFO_KEYS = {"model": "sd_model_name", "seed": "seed", "sampler_name": "sampler_name"}


def _ran_info(text: Any, body: Mapping[str, Any], ran: Mapping[str, str]) -> str:
    """The webui's ``info`` (JSON in a string) naming the model, seed and sampler that ran:
    the backend's own figures where it sent them, else what the agent reported filling in.
    A model's title (``name [hash]``) is given as the webui's ``sd_model_name``, the name."""
    try:
        info = json.loads(text) if isinstance(text, str) and text else _info_from(body)
    except ValueError:
        info = _info_from(body)
    if not isinstance(info, dict):
        return str(text)
    for key, name in _INFO_KEYS.items():
        if key in ran and info.get(name) in (None, "", -1):
            info[name] = _typed(name, ran[key])
    if isinstance(info.get("seed"), int) and not info.get("all_seeds"):
        info["all_seeds"] = [info["seed"]]
    return json.dumps(info)


def _ran_parameters(body: Mapping[str, Any], ran: Mapping[str, str]) -> dict[str, Any]:
    """The request as the webui echoes it, with what the request left open filled in as it
    ran: the drawn seed for ``seed: -1``, the backend's sampler when none was named."""
    params = dict(body)
    if "seed" in ran and params.get("seed", -1) in (-1, None):
        params["seed"] = _typed("seed", ran["seed"])
    if "sampler_name" in ran and not params.get("sampler_name"):
        params["sampler_name"] = ran["sampler_name"]
    return params


def _typed(name: str, value: str) -> Any:
    """A ``ran`` value (text on the wire) as the webui types it: the seed is a number."""
    if name == "seed":
        try:
            return int(value)
        except ValueError:
            return value
    return value.split(" [")[0] if name == "sd_model_name" else value
