"""How jobs' models are named, found in graphs and prompts, and read back from failures."""

from __future__ import annotations

from corral.agent.reference.comfyui import txt2img_workflow
from corral.agent.reference.comfyui_nodes import object_info
from corral.core.comfyui import validate_prompt
from corral.core.model_names import (
    a1111_models,
    comfyui_lacks,
    comfyui_models,
    is_checkpoint,
    job_models,
    lacked,
    lacking,
)


def test_a_graphs_files_are_named_by_kind() -> None:
    graph = txt2img_workflow("x", ckpt="sd15/base.safetensors", lora="ink.safetensors", vae="v.pt")
    assert comfyui_models(graph) == ("lora:ink.safetensors", "sd15/base.safetensors", "vae:v.pt")
    # VAELoader also offers decoders that are no file: they are not models a node lists
    graph["11"]["inputs"]["vae_name"] = "taesd"
    assert comfyui_models(graph) == ("lora:ink.safetensors", "sd15/base.safetensors")


def test_a_webui_prompt_names_loras_and_its_overrides_a_vae() -> None:
    request = {
        "prompt": "a cat <lora:ink:0.8>, <lora:paper> <hypernet:x:1>",
        "negative_prompt": "<lora:blur:-1>",
        "override_settings": {"sd_vae": "vae-ft-mse.safetensors"},
    }
    assert a1111_models(request) == (
        "lora:blur",
        "lora:ink",
        "lora:paper",
        "vae:vae-ft-mse.safetensors",
    )
    assert a1111_models({"prompt": "x", "override_settings": {"sd_vae": "Automatic"}}) == ()
    assert job_models("a1111", {"prompt": "<lora:ink:1>"}) == {"lora:ink"}
    assert job_models("python", {"prompt": "<lora:ink:1>"}) == frozenset()


def test_only_bare_names_are_checkpoints() -> None:
    assert is_checkpoint("sd15/base.safetensors")
    assert is_checkpoint("org/sdxl")
    assert is_checkpoint("weird:name")
    assert not is_checkpoint("lora:ink")
    assert not is_checkpoint("embedding:bad-hands")


def test_a_lacking_failure_reads_back_its_models_and_no_other_failure_does() -> None:
    error = lacking("comfyui", ["lora:a b.safetensors", 'x"y'], "comfyui refused it")
    assert lacked(error) == ("lora:a b.safetensors", 'x"y')
    assert lacked(f"attempt 1 on gpu-1: {error}") == ("lora:a b.safetensors", 'x"y')
    assert lacked("CUDA out of memory") == ()
    assert lacked("comfyui: models missing on this node: [broken") == ()


def test_only_a_refusal_for_missing_files_alone_is_a_lacking_one() -> None:
    graph = txt2img_workflow("x", ckpt="big.safetensors", lora="ink.safetensors")
    info = object_info(("tiny.safetensors",), {"loras": ["other.safetensors"]})
    refused = validate_prompt(graph, info)
    assert comfyui_lacks(refused.node_errors) == ("big.safetensors", "lora:ink.safetensors")
    graph["5"]["inputs"]["width"] = 0  # wrong on every node as well
    assert comfyui_lacks(validate_prompt(graph, info).node_errors) == ()


def test_a_long_list_is_cut_so_the_attempt_history_keeps_it_whole() -> None:
    many = [f"lora:{'x' * 40}-{i}.safetensors" for i in range(50)]
    error = lacking("comfyui", many, "and the backend's long reason " * 40)
    found = lacked(error[:500])  # what the server keeps of an attempt's error
    assert found
    assert set(found) <= set(many)
    assert lacked(lacking("a1111", ["y" * 1000])) == ("y" * 300,)
