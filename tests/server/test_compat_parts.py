"""The drop-in APIs' pure parts: credentials, model names, /progress, ComfyUI messages."""

from __future__ import annotations

import base64
import struct

import pytest

from corral.core.events import Event, EventKind
from corral.server.api.compat_auth import credentials
from corral.server.services.compat_a1111 import Tracker, idle_progress, progress_body
from corral.server.services.compat_catalog import Catalog, find_model, model_entries
from corral.server.services.compat_comfyui import outputs_for
from corral.server.services.compat_comfyui_events import (
    PreviewRef,
    PromptWatch,
    preview_frame,
    translate,
)

WORKFLOW = {
    "3": {"class_type": "KSampler", "inputs": {"seed": 1}},
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny.safetensors"}},
    "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
    "10": {"class_type": "SaveImage", "inputs": {"filename_prefix": "late", "images": ["8", 0]}},
}


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("header", "query", "want"),
    [
        pytest.param(basic("ana:tok"), None, ("tok", "ana"), id="basic-user-and-token"),
        pytest.param(basic(":tok"), None, ("tok", None), id="basic-without-user"),
        pytest.param(basic("ana:"), None, (None, "ana"), id="basic-without-token"),
        pytest.param("Basic !!!", None, (None, None), id="basic-not-base64"),
        pytest.param(basic("no-colon"), None, (None, None), id="basic-without-colon"),
        pytest.param("Bearer tok", None, ("tok", None), id="bearer"),
        pytest.param(None, "tok", ("tok", None), id="query-token-for-browsers"),
        pytest.param("Digest x", None, (None, None), id="unknown-scheme"),
    ],
)
def test_credentials_as_tools_send_them(
    header: str | None, query: str | None, want: tuple[str | None, str | None]
) -> None:
    assert credentials(header, query) == want


SD_MODELS = [
    {
        "title": "tiny-sd.safetensors [abc]",
        "model_name": "tiny-sd",
        "filename": "/m/Stable-diffusion/tiny-sd.safetensors",
    },
]


@pytest.mark.parametrize(
    "name", ["tiny-sd", "tiny-sd.safetensors", "tiny-sd.safetensors [abc]", "tiny-sd [zzz]"]
)
def test_a_checkpoint_answers_to_every_name_the_webui_accepts(name: str) -> None:
    assert find_model(name, SD_MODELS) == SD_MODELS[0]


def test_sd_models_adds_what_other_nodes_reported() -> None:
    from corral.core.model import Node

    catalog = Catalog({"sd-models": SD_MODELS}, "n1", 0.0)
    nodes = [
        Node("n1", models_on_disk=frozenset({"tiny-sd"})),
        Node("n2", models_on_disk=frozenset({"sdxl", "tiny-sd"})),
        # a node that runs ComfyUI too: its file names and the LoRAs are not webui checkpoints
        Node("n3", models_on_disk=frozenset({"flux.safetensors", "lora:ink", "vae:v.pt"})),
    ]
    entries = model_entries(catalog, nodes)
    assert [e["model_name"] for e in entries] == ["tiny-sd", "sdxl"]
    assert find_model("sdxl", entries) is not None
    assert find_model("flux", entries) is None


def test_progress_of_a_queued_then_running_request() -> None:
    t = Tracker("job_1", "scripts_txt2img", submitted_at=100.0)
    queued = progress_body(t, 1, now=101.0, image=None)
    assert (queued["progress"], queued["state"]["job_count"]) == (0.0, 1)
    assert "queue" in queued["textinfo"]
    t.started_at, t.fraction, t.step, t.steps = 102.0, 0.5, 10, 20
    running = progress_body(t, 1, now=104.0, image="abc")
    assert running["progress"] == 0.5
    assert running["eta_relative"] == pytest.approx(2.0)
    assert running["state"]["sampling_step"] == 10
    assert running["current_image"] == "abc"
    assert idle_progress()["state"]["job_count"] == 0


@pytest.mark.anyio
async def test_a_tracker_follows_the_jobs_events() -> None:
    t = Tracker("job_1", "scripts_txt2img", submitted_at=100.0)
    await t.see(Event(EventKind.JOB_STARTED, 101.0, "job_1", None, {}))
    await t.see(
        Event(
            EventKind.JOB_PROGRESS, 102.0, "job_1", None, {"progress": 0.25, "message": "step 5/20"}
        )
    )
    await t.see(Event(EventKind.JOB_PREVIEW, 102.0, "job_1", None, {"url": "/v1/x/1.png"}))
    assert (t.started_at, t.fraction, t.step, t.steps, t.preview_url) == (
        101.0,
        0.25,
        5,
        20,
        "/v1/x/1.png",
    )


def test_outputs_go_to_the_node_whose_prefix_they_carry() -> None:
    outputs = outputs_for(WORKFLOW, ["late_00001_.png", "ComfyUI_00001_.png"], "job_1")
    assert outputs == {
        "9": {
            "images": [{"filename": "ComfyUI_00001_.png", "subfolder": "job_1", "type": "output"}]
        },
        "10": {"images": [{"filename": "late_00001_.png", "subfolder": "job_1", "type": "output"}]},
    }


def test_history_lists_a_video_nodes_files_under_gifs_and_sound_under_audio() -> None:
    workflow = {
        **WORKFLOW,
        "11": {"class_type": "VHS_VideoCombine", "inputs": {"filename_prefix": "clip"}},
        "12": {"class_type": "SaveAudio", "inputs": {"filename_prefix": "song"}},
    }
    names = ["clip_00001.mp4", "song_00001_.flac", "ComfyUI_00001_.png"]
    outputs = outputs_for(workflow, names, "job_1")
    where = {"subfolder": "job_1", "type": "output"}
    assert outputs["11"] == {
        "gifs": [{"filename": "clip_00001.mp4", **where, "format": "video/mp4"}]
    }
    assert outputs["12"] == {"audio": [{"filename": "song_00001_.flac", **where}]}
    assert outputs["9"] == {"images": [{"filename": "ComfyUI_00001_.png", **where}]}


def test_history_lists_each_file_as_the_backend_listed_it() -> None:
    """With the job's comfyui-outputs.json: the backend's node, kind and subfolder."""
    manifest = {
        "outputs": {
            "20": {
                "latents": [
                    {
                        "filename": "ComfyUI_00001_.latent",
                        "subfolder": "latents",
                        "type": "output",
                        "result": "ComfyUI_00001_-2.latent",
                    }
                ]
            },
            "30": {"text": ["a caption"]},
        }
    }
    outputs = outputs_for(WORKFLOW, ["ComfyUI_00001_-2.latent"], "job_1", manifest)
    assert outputs == {
        "20": {
            "latents": [
                {
                    "filename": "ComfyUI_00001_-2.latent",
                    "subfolder": "job_1/latents",
                    "type": "output",
                }
            ]
        },
        "30": {"text": ["a caption"]},
    }


def event(kind: EventKind, **data: object) -> Event:
    return Event(kind, 5.0, "job_1", None, data)


def test_job_events_become_comfyuis_messages_in_order() -> None:
    watch = PromptWatch("job_1", "p1", WORKFLOW)
    script = [
        event(EventKind.JOB_STARTED),
        event(EventKind.JOB_PROGRESS, progress=0.5, message="node 3: 2/4"),
        event(
            EventKind.JOB_PREVIEW, url="/v1/jobs/job_1/previews/a.jpg", content_type="image/jpeg"
        ),
        event(EventKind.JOB_PROGRESS, progress=0.75, message="node 3: 3/4"),
        event(EventKind.JOB_PROGRESS, progress=1.0),  # the agent's "done": ComfyUI has none
        event(EventKind.JOB_SUCCEEDED, files=["ComfyUI_00001_.png"]),
    ]
    out = [m for e in script for m in translate(e, watch)]
    kinds = [m.get("type") if isinstance(m, dict) else "preview" for m in out]
    assert kinds == [
        "execution_start",
        "execution_cached",
        "executing",
        "progress",
        "preview",
        "progress",
        "executing",
        "executed",
        "execution_success",
        "executing",
    ]
    assert out[3] == {
        "type": "progress",
        "data": {"value": 2, "max": 4, "prompt_id": "p1", "node": "3"},
    }
    assert out[4] == PreviewRef("/v1/jobs/job_1/previews/a.jpg", "image/jpeg")
    assert out[-1] == {
        "type": "executing",
        "data": {"node": None, "display_node": None, "prompt_id": "p1"},
    }
    assert watch.ended


@pytest.mark.parametrize(
    ("ending", "want"),
    [
        pytest.param(event(EventKind.JOB_FAILED, error="boom"), "execution_error", id="failed"),
        pytest.param(event(EventKind.JOB_CANCELLED), "execution_interrupted", id="cancelled"),
        pytest.param(
            event(EventKind.JOB_SUCCEEDED, files=[], interrupted=True),
            "execution_interrupted",
            id="interrupted",
        ),
    ],
)
def test_a_prompt_that_did_not_succeed_still_ends_with_executing_none(
    ending: Event, want: str
) -> None:
    out = translate(ending, PromptWatch("job_1", "p1", WORKFLOW))
    kinds = [m["type"] for m in out if isinstance(m, dict)]
    assert kinds[-2:] == [want, "executing"]


def test_preview_frames_carry_comfyuis_header() -> None:
    assert struct.unpack(">II", preview_frame(b"img", "image/png")[:8]) == (1, 2)
    assert preview_frame(b"img", "image/jpeg")[8:] == b"img"
