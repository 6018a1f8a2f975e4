"""ComfyUI's prompt validation (``corral.core.comfyui``): the errors ComfyUI gives, case by
case, with its type names, messages and details."""

from __future__ import annotations

from typing import Any

import pytest

from corral.core.comfyui import describe, validate_prompt

INFO: dict[str, Any] = {
    "CheckpointLoaderSimple": {
        "input": {"required": {"ckpt_name": [["tiny.safetensors"]]}},
        "output": ["MODEL", "CLIP", "VAE"],
        "output_node": False,
    },
    "EmptyLatentImage": {
        "input": {"required": {"width": ["INT", {"min": 16, "max": 16384}]}},
        "output": ["LATENT"],
        "output_node": False,
    },
    "SaveLatent": {
        "input": {"required": {"samples": ["LATENT"], "filename_prefix": ["STRING"]}},
        "output": [],
        "output_node": True,
    },
    "SaveModel": {  # a stand-in output fed by the loader
        "input": {"required": {"model": ["MODEL"]}, "optional": {"note": ["STRING"]}},
        "output": [],
        "output_node": True,
    },
}


def graph(width: Any = 64, ckpt: str = "tiny.safetensors", **extra: Any) -> dict[str, Any]:
    nodes: dict[str, Any] = {
        "1": {"class_type": "EmptyLatentImage", "inputs": {"width": width}},
        "2": {"class_type": "SaveLatent", "inputs": {"samples": ["1", 0], "filename_prefix": "x"}},
        "3": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "4": {"class_type": "SaveModel", "inputs": {"model": ["3", 0]}},
    }
    nodes.update(extra)
    return nodes


@pytest.mark.parametrize(
    ("prompt", "want_node", "want_type", "want_message", "want_details"),
    [
        pytest.param(
            graph(width=0),
            "1",
            "value_smaller_than_min",
            "Value 0 smaller than min of 16",
            "width",
            id="below-min",
        ),
        pytest.param(
            graph(width=20000),
            "1",
            "value_bigger_than_max",
            "Value 20000 bigger than max of 16384",
            "width",
            id="above-max",
        ),
        pytest.param(
            graph(width="wide"),
            "1",
            "invalid_input_type",
            "Failed to convert an input value to a INT value",
            "width, wide, invalid literal for int() with base 10: 'wide'",
            id="not-a-number",
        ),
        pytest.param(
            graph(ckpt="sdxl.safetensors"),
            "3",
            "value_not_in_list",
            "Value not in list",
            "ckpt_name: 'sdxl.safetensors' not in ['tiny.safetensors']",
            id="not-in-list",
        ),
        pytest.param(
            graph(**{"2": {"class_type": "SaveLatent", "inputs": {"samples": ["1", 0]}}}),
            "2",
            "required_input_missing",
            "Required input is missing",
            "filename_prefix",
            id="required-missing",
        ),
        pytest.param(
            graph(**{"4": {"class_type": "SaveModel", "inputs": {"model": ["1", 0]}}}),
            "4",
            "return_type_mismatch",
            "Return type mismatch between linked nodes",
            "model, received_type(LATENT) mismatch input_type(MODEL)",
            id="wrong-link-type",
        ),
        pytest.param(
            graph(**{"4": {"class_type": "SaveModel", "inputs": {"model": ["3"]}}}),
            "4",
            "bad_linked_input",
            "Bad linked input, must be a length-2 list of [node_id, slot_index]",
            "model",
            id="bad-link-shape",
        ),
    ],
)
def test_a_bad_input_drops_its_output_with_comfyuis_error(
    prompt: dict[str, Any], want_node: str, want_type: str, want_message: str, want_details: str
) -> None:
    checked = validate_prompt(prompt, INFO)
    assert checked.error is None  # the other output is fine: it runs (ComfyUI's 200)
    (node,) = checked.node_errors
    assert node == want_node
    (err,) = checked.node_errors[node]["errors"]
    assert (err["type"], err["message"], err["details"]) == (want_type, want_message, want_details)
    assert len(checked.outputs) == 1


def test_no_valid_output_left_is_comfyuis_refusal() -> None:
    checked = validate_prompt(graph(width=0, ckpt="nope"), INFO)
    assert checked.error is not None
    assert checked.error["type"] == "prompt_outputs_failed_validation"
    assert checked.error["message"] == "Prompt outputs failed validation"
    assert checked.outputs == []
    assert sorted(checked.node_errors) == ["1", "3"]
    # as in ComfyUI, every failed output is added to each bad node seen so far
    assert checked.node_errors["1"]["dependent_outputs"] == ["2", "4"]
    assert checked.node_errors["3"]["dependent_outputs"] == ["4"]
    assert describe(checked.node_errors) == (
        "node #1 (EmptyLatentImage) input width: Value 0 smaller than min of 16; "
        "node #3 (CheckpointLoaderSimple) input ckpt_name: Value not in list: "
        "ckpt_name: 'nope' not in ['tiny.safetensors']"
    )


def test_values_are_converted_and_unknown_inputs_ignored() -> None:
    prompt = graph(width="64")
    prompt["2"]["inputs"]["corral_rerun"] = "abc"  # no node declares it: not validated
    checked = validate_prompt(prompt, INFO)
    assert (checked.error, checked.node_errors) == (None, {})
    assert prompt["1"]["inputs"]["width"] == 64  # converted in place, as ComfyUI does
    assert sorted(checked.outputs) == ["2", "4"]


def test_model_lists_can_be_left_unchecked() -> None:
    checked = validate_prompt(graph(ckpt="sdxl"), INFO, unchecked_lists={"ckpt_name"})
    assert checked.node_errors == {}


@pytest.mark.parametrize(
    ("prompt", "want_type", "want_message"),
    [
        pytest.param(
            {"1": {"class_type": "Nope", "inputs": {}}},
            "invalid_prompt",
            "Cannot execute because node Nope does not exist.",
            id="unknown-node",
        ),
        pytest.param(
            {"1": {"inputs": {}}},
            "invalid_prompt",
            "Cannot execute because a node is missing the class_type property.",
            id="no-class-type",
        ),
        pytest.param(
            {"1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64}}},
            "prompt_no_outputs",
            "Prompt has no outputs",
            id="no-outputs",
        ),
    ],
)
def test_a_graph_comfyui_cannot_read_is_refused_whole(
    prompt: dict[str, Any], want_type: str, want_message: str
) -> None:
    checked = validate_prompt(prompt, INFO)
    assert checked.error is not None
    assert (checked.error["type"], checked.error["message"]) == (want_type, want_message)


def test_a_link_to_a_missing_node_is_an_exception_during_validation() -> None:
    prompt = graph(**{"4": {"class_type": "SaveModel", "inputs": {"model": ["99", 0]}}})
    checked = validate_prompt(prompt, INFO)
    (err,) = checked.node_errors["4"]["errors"]
    assert (err["type"], err["details"]) == ("exception_during_validation", "'99'")
