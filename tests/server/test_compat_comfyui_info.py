"""The cluster as one ComfyUI (pure parts): merging nodes' ``object_info``, the model
folders read from it, and ComfyUI's ``/jobs`` entries from ``/queue`` and ``/history``."""

from __future__ import annotations

from typing import Any

import pytest

from corral.server.services.compat_comfyui_info import folder_files, job_entries, union


def loader(names: list[str], *, combo: bool = False) -> dict[str, Any]:
    """A ``CheckpointLoaderSimple`` in ComfyUI's old (``[[...]]``) or V3 (``COMBO``) form."""
    spec = ["COMBO", {"options": names}] if combo else [names]
    return {"input": {"required": {"ckpt_name": spec}}, "output": ["MODEL", "CLIP", "VAE"]}


@pytest.mark.parametrize("combo", [False, True], ids=["list-form", "combo-form"])
def test_the_union_lists_every_node_type_and_every_nodes_choices(combo: bool) -> None:
    a = {"CheckpointLoaderSimple": loader(["a.safetensors", "shared.safetensors"], combo=combo)}
    b = {
        "CheckpointLoaderSimple": loader(["shared.safetensors", "b.safetensors"], combo=combo),
        "OnlyOnB": {"input": {}, "output": []},
    }
    merged = union([a, b])
    assert set(merged) == {"CheckpointLoaderSimple", "OnlyOnB"}
    assert folder_files(merged, "checkpoints") == [
        "a.safetensors",
        "b.safetensors",
        "shared.safetensors",
    ]
    before = folder_files(a, "checkpoints")
    union([a, b])
    assert folder_files(a, "checkpoints") == before  # the nodes' own descriptions unchanged


def test_folders_no_core_loader_reads_list_nothing() -> None:
    info = {"CheckpointLoaderSimple": loader(["x.safetensors"])}
    assert folder_files(info, "configs") == []
    assert folder_files(info, "loras") == []


def history_entry(status: str, number: int, start: int, end: int) -> dict[str, Any]:
    ending = {"success": "execution_success", "error": "execution_error"}[status]
    return {
        "prompt": [number, "p", {}, {"client_id": "", "create_time": start}, ["9"]],
        "outputs": {
            "9": {"images": [{"filename": "a.png", "subfolder": "job_1", "type": "output"}]}
        },
        "status": {
            "status_str": status,
            "completed": status == "success",
            "messages": [["execution_start", {"timestamp": start}], [ending, {"timestamp": end}]],
        },
    }


def test_jobs_are_comfyuis_entries_newest_first_filtered_by_status() -> None:
    queue = {
        "queue_running": [[3, "run", {}, {"create_time": 300}, ["9"]]],
        "queue_pending": [[4, "wait", {}, {"create_time": 400}, ["9"]]],
    }
    history = {
        "ok": history_entry("success", 1, 100, 150),
        "bad": history_entry("error", 2, 200, 250),
    }
    every = job_entries(queue, history, ["pending", "in_progress", "completed", "failed"])
    assert [(j["id"], j["status"]) for j in every] == [
        ("wait", "pending"),
        ("run", "in_progress"),
        ("bad", "failed"),
        ("ok", "completed"),
    ]
    ok = every[-1]
    assert (ok["execution_start_time"], ok["execution_end_time"], ok["outputs_count"]) == (
        100,
        150,
        1,
    )
    assert ok["preview_output"]["nodeId"] == "9"
    assert [j["id"] for j in job_entries(queue, history, ["failed"])] == ["bad"]
