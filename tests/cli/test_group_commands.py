"""``corral pipeline`` and ``corral array`` against a server whose stub agents run jobs."""

from __future__ import annotations

import json

import yaml
from cli_runner import Cli
from live_server import Running


def test_a_pipeline_file_is_submitted_and_followed_to_its_end(
    cli: Cli, stub: Running, team: str
) -> None:
    cli = cli.against(stub)
    pipeline = {
        "team": team,
        "steps": {
            "txt2img": {"payload": {"files": {"image.png": "pixels"}}, "outputs": ["image.png"]},
            "upscale": {"inputs": [{"from": "txt2img", "file": "image.png", "as": "init.png"}]},
        },
    }
    result = cli("pipeline", "submit", "-", "--follow", input=yaml.safe_dump(pipeline))
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.stdout
    assert "txt2img" in result.stdout
    shown = cli("pipeline", "show", _id(result.stdout), "--json")
    body = json.loads(shown.stdout)
    assert [s["after"] for s in body["steps"]] == [[], ["txt2img"]]


def test_a_refused_pipeline_names_the_step_and_field(cli: Cli, stub: Running, team: str) -> None:
    cli = cli.against(stub)
    cyclic = {"team": team, "steps": {"a": {"after": ["b"]}, "b": {"after": ["a"]}}}
    result = cli("pipeline", "submit", "-", input=json.dumps(cyclic))
    assert result.exit_code != 0
    assert "steps.a.after" in result.output
    assert "cycle" in result.output


def test_an_array_is_submitted_reprioritised_and_cancelled(
    cli: Cli, stub: Running, team: str
) -> None:
    cli = cli.against(stub)
    job = {"team": team, "payload": {"steps": 50, "step_s": 0.2}}
    made = cli(
        "array", "submit", "-", "--count", "3", "--index-key", "seed", "--json",
        input=json.dumps(job),
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    body = json.loads(made.stdout)
    assert sorted(j["payload"]["seed"] for j in body["jobs"]) == [0, 1, 2]
    moved = cli("array", "priority", body["id"], "batch")
    assert moved.exit_code == 0, moved.output
    gone = cli("array", "cancel", body["id"])
    assert gone.exit_code == 0, gone.output
    assert "cancelled" in gone.stdout


def _id(text: str) -> str:
    return next(w for w in text.replace(":", " ").split() if w.startswith("pipe_"))
